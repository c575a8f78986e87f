// The MPI transport (comm/mpi/), SPMD pipelines (pipeline/mpi/) and parameter servers
// (ps/mpi/), through mpirun:
// tests/mpi_roles.h is the program every rank runs.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "mpirun.h"
#include "ps/checkpoint.h"
#include "ps_task.h"

using namespace pipit::testing;

namespace {

// Each rank's "rank R pair sums N" line: paired, every rank's stage summed each of the role's
// 3 steps with MPI_Iallreduce (at least one bucket a step); otherwise none.
void check_pair_sums(const std::string& output, int ranks, bool paired) {
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string label = "rank " + std::to_string(rank) + " pair sums ";
    const size_t at = output.find(label);
    REQUIRE(at != std::string::npos);
    const long sums = std::stol(output.substr(at + label.size()));
    INFO(label << sums);
    CHECK((paired ? sums >= 3 : sums == 0));
  }
}

}  // namespace

TEST_CASE("MPI: tensors between ranks and endpoints sharing a rank, from several threads",
          "[mpi]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(3, "exchange");
  INFO(run.output);
  CHECK(run.status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(run.output.find("rank " + std::to_string(rank) + " ok") != std::string::npos);
  }
}

TEST_CASE("MPI: malformed frames are dropped with their bodies and named", "[mpi]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(2, "malformed");
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("malformed ok") != std::string::npos);
  CHECK(run.output.find("dropped a message: MPI: a frame from rank 1 has 10 bytes, too short "
                        "for its route") != std::string::npos);
  CHECK(run.output.find("dropped a message: frame: bad magic") != std::string::npos);
  CHECK(run.output.find("dropped a message: MPI: a frame from rank 1 does not match its "
                        "checksum") != std::string::npos);
}

TEST_CASE("MPI: doorbells wake a sleeping rank and lose no ring", "[mpi]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(2, "doorbells");
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("doorbells ok") != std::string::npos);
}

TEST_CASE("MPI: an SPMD pipeline equals the in-process one bit for bit, every schedule", "[mpi]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv"}) {
    for (int ranks : {2, 4}) {
      DYNAMIC_SECTION(schedule << ", " << ranks << " ranks") {
        const Run run = mpirun(ranks, "pipeline " + schedule);
        INFO(run.output);
        CHECK(run.status == 0);
        CHECK(run.output.find("pipeline ok") != std::string::npos);
      }
    }
  }
}

TEST_CASE("MPI: stages x 2 replicas as ranks equal the in-process pipelines bit for bit",
          "[mpi][replicas]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"1f1b", "interleaved", "zbh1"}) {
    for (int ranks : {2, 4}) {
      DYNAMIC_SECTION(schedule << ", " << ranks << " ranks") {
        // The chain over MPI messages (the default) and MPI_Iallreduce pairs: the same bits.
        for (const bool paired : {false, true}) {
          const Run run =
              mpirun(ranks, (paired ? "paired-replica-pipeline " : "replica-pipeline ") + schedule);
          INFO(run.output);
          CHECK(run.status == 0);
          CHECK(run.output.find("pipeline ok") != std::string::npos);
          check_pair_sums(run.output, ranks, paired);
        }
      }
    }
  }
}

TEST_CASE("MPI: ranks run stage s of replica k at s * r + k, or at k * p + s by pipelines",
          "[mpi][replicas]") {
  if (!mpi_ready()) return;
  // 4 ranks: 2 stages x 2 replicas.
  for (const auto& [layout, expected] :
       std::vector<std::pair<std::string, std::vector<std::string> > >{
           {"stages",
            {"rank 0 runs stage 0 of replica 0", "rank 1 runs stage 0 of replica 1",
             "rank 2 runs stage 1 of replica 0", "rank 3 runs stage 1 of replica 1"}},
           {"pipelines",
            {"rank 0 runs stage 0 of replica 0", "rank 1 runs stage 1 of replica 0",
             "rank 2 runs stage 0 of replica 1", "rank 3 runs stage 1 of replica 1"}}}) {
    DYNAMIC_SECTION(layout) {
      const Run run = mpirun(4, "replica-pipeline 1f1b " + layout);
      INFO(run.output);
      CHECK(run.status == 0);
      CHECK(run.output.find("pipeline ok") != std::string::npos);
      for (const std::string& line : expected) CHECK(run.output.find(line) != std::string::npos);
      check_pair_sums(run.output, 4, false);
    }
  }
}

TEST_CASE(
    "MPI: stages x 2 replicas with the optimizer sharded (ZeRO-1) equal unsharded in-process "
    "pipelines bit for bit",
    "[mpi][replicas]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"1f1b", "zbv"}) {
    for (int ranks : {2, 4}) {
      DYNAMIC_SECTION(schedule << ", " << ranks << " ranks") {
        const Run run = mpirun(ranks, "sharded-replica-pipeline " + schedule);
        INFO(run.output);
        CHECK(run.status == 0);
        CHECK(run.output.find("pipeline ok") != std::string::npos);
        check_pair_sums(run.output, ranks, true);
      }
    }
  }
}

TEST_CASE("MPI: a pipeline with tied parameters equals the in-process one bit for bit", "[mpi]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"1f1b", "interleaved", "zbv"}) {
    for (int ranks : {2, 4}) {
      DYNAMIC_SECTION(schedule << ", " << ranks << " ranks") {
        const Run run = mpirun(ranks, "tied-pipeline " + schedule);
        INFO(run.output);
        CHECK(run.status == 0);
        CHECK(run.output.find("pipeline ok") != std::string::npos);
      }
    }
  }
}

TEST_CASE(
    "MPI: 2 replicas of a pipeline with tied parameters equal the in-process ones bit for bit",
    "[mpi][replicas][tied_pipeline]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"1f1b", "zbv"}) {
    for (int ranks : {2, 4}) {
      DYNAMIC_SECTION(schedule << ", " << ranks << " ranks") {
        const Run run = mpirun(ranks, "tied-replica-pipeline " + schedule);
        INFO(run.output);
        CHECK(run.status == 0);
        CHECK(run.output.find("pipeline ok") != std::string::npos);
      }
    }
  }
}

TEST_CASE("MPI: all_reduce over ranks gives every rank the in-order sum, bit for bit", "[mpi]") {
  if (!mpi_ready()) return;
  for (int ranks : {2, 3, 5}) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const Run run = mpirun(ranks, "all-reduce");
      INFO(run.output);
      CHECK(run.status == 0);
      size_t ok = 0;
      for (size_t at = run.output.find("all-reduce ok"); at != std::string::npos;
           at = run.output.find("all-reduce ok", at + 1)) {
        ++ok;
      }
      CHECK(ok == static_cast<size_t>(ranks));
    }
  }
}

TEST_CASE(
    "MPI: 1 x 3, 2 x 3 (recomputing) and 4 x 2 replica pipelines sum in the chain over MPI "
    "messages (MPI does not fix a sum of three's order) and equal the in-process pipelines bit "
    "for bit",
    "[mpi][replicas]") {
  if (!mpi_ready()) return;
  for (const auto& [ranks, role] :
       std::vector<std::pair<int, std::string> >{{3, "three-replica-pipeline 1f1b"},
                                                 {3, "three-replica-pipeline zbv"},
                                                 {6, "recomputed-three-replica-pipeline zbh2"},
                                                 {8, "replica-pipeline gpipe"}}) {
    DYNAMIC_SECTION(role << ", " << ranks << " ranks") {
      const Run run = mpirun(ranks, role);
      INFO(run.output);
      CHECK(run.status == 0);
      CHECK(run.output.find("pipeline ok") != std::string::npos);
      check_pair_sums(run.output, ranks, false);
    }
  }
}

// The whole matrix of tests/replicas_test.cpp as MPI ranks (96 mpirun jobs, a few minutes):
// run it by hand, pipit_tests "[mpi_full]".
TEST_CASE("MPI: every schedule, (p, r), recomputation and ZeRO-1 as ranks", "[.][mpi_full]") {
  if (!mpi_ready()) return;
  for (const auto& [p, r] : std::vector<std::pair<int, int> >{{1, 2}, {2, 2}, {2, 3}, {4, 2}}) {
    for (const std::string schedule : {"gpipe", "1f1b", "zbh1", "zbh2", "interleaved", "zbv"}) {
      for (const std::string recompute : {"0", "1"}) {
        for (const std::string shard : {"0", "1"}) {
          const std::string role = "matrix-pipeline " + schedule + " " + std::to_string(r) + " " +
                                   recompute + " " + shard;
          INFO(role << " on " << p * r << " ranks");
          const Run run = mpirun(p * r, role);
          INFO(run.output);
          CHECK(run.status == 0);
          CHECK(run.output.find("pipeline ok") != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE(
    "MPI: a pair sum is MPI_Iallreduce's a + b, and a sum one side skipped is matched with "
    "nothing",
    "[mpi][replicas]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(2, "pair-sum");
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("pair sums ok on rank 0 (3 done)") != std::string::npos);
  CHECK(run.output.find("pair sums ok on rank 1 (3 done)") != std::string::npos);
}

TEST_CASE("MPI: pipelined generation equals the whole model", "[mpi]") {
  if (!mpi_ready()) return;
  for (const std::string schedule : {"1f1b", "zbv"}) {
    DYNAMIC_SECTION(schedule) {
      const Run run = mpirun(3, "generate " + schedule);
      INFO(run.output);
      CHECK(run.status == 0);
      CHECK(run.output.find("generate ok") != std::string::npos);
    }
  }
}

TEST_CASE("MPI: the validation loss through ranks is the model's own forward loss",
          "[mpi][evaluate]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(2, "evaluate");
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("evaluate ok") != std::string::npos);
}

TEST_CASE("Slurm: srun starts the ranks of an SPMD pipeline, equal to the in-process one",
          "[mpi][slurm]") {
  if (!mpi_ready() || !slurm_ready()) return;
  for (const std::string role : {"pipeline 1f1b", "replica-pipeline zbh1"}) {
    DYNAMIC_SECTION(role) {
      const Run run = srun(4, role);
      INFO(run.output);
      CHECK(run.status == 0);
      CHECK(run.output.find("pipeline ok") != std::string::npos);
    }
  }
}

TEST_CASE("MPI: ranks that built different models are named at start-up", "[mpi]") {
  if (!mpi_ready()) return;
  const Run run = mpirun(2, "mismatch");
  INFO(run.output);
  CHECK(run.status != 0);
  CHECK(run.output.find("ranks 1 built a different model or configuration than rank 0") !=
        std::string::npos);
}

TEST_CASE("MPI: sync parameter-server training equals large-batch training bit for bit",
          "[mpi][ps]") {
  if (!mpi_ready()) return;
  for (const std::string optimizer : {"sgd", "adamw"}) {
    DYNAMIC_SECTION(optimizer) {
      const Run run = mpirun(5, "ps " + optimizer);
      INFO(run.output);
      CHECK(run.status == 0);
      for (int rank = 0; rank < 5; ++rank) {
        CHECK(run.output.find("ps rank " + std::to_string(rank) + " ok") != std::string::npos);
      }
    }
  }
}

TEST_CASE("MPI: a killed parameter-server shard's rank resumes bit for bit", "[mpi][ps]") {
  if (!mpi_ready()) return;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pipit_mpi_ps_resume_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const Run killed = mpirun(4, "ps-resume killed " + dir.string());
  INFO(killed.output);
  CHECK(killed.status != 0);
  const int64_t saved = common_checkpoint_version(dir.string(), 2);
  // Shard 1's rank died once it saved version 10; shard 0, up to one update behind, may not
  // have saved 10 yet, and then both resume at 5 (checkpoint_every in the role).
  CHECK(saved >= 5);
  CHECK(saved < kPsResumeSteps);
  const Run resumed = mpirun(4, "ps-resume resumed " + dir.string());
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK(resumed.output.find("ps-resumed rank 0 ok") != std::string::npos);
  CHECK(resumed.output.find("ps-resumed rank 1 ok") != std::string::npos);
  std::filesystem::remove_all(dir);
}

// Failing ranks end the job within seconds, not after the others' timeouts (60 s here).
TEST_CASE("MPI: a killed rank or a failing one ends the job, naming the rank", "[mpi]") {
  if (!mpi_ready()) return;
  auto timed = [](int ranks, const std::string& role) {
    const auto start = std::chrono::steady_clock::now();
    const Run run = mpirun(ranks, role);
    return std::pair{
        run, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  };
  SECTION("a stage's rank killed while training") {
    const auto [run, seconds] = timed(3, "killed");
    INFO(run.output);
    CHECK(run.status != 0);
    CHECK(seconds < 30);
    CHECK(run.output.find("rank 2: stage 2") != std::string::npos);
    CHECK(run.output.find("process rank 2") != std::string::npos);
  }
  SECTION("a parameter-server worker that throws") {
    const auto [run, seconds] = timed(5, "failing-worker");
    INFO(run.output);
    CHECK(run.status != 0);
    CHECK(seconds < 30);
    CHECK(run.output.find("worker 1 cannot read its batch at step 2") != std::string::npos);
  }
}
