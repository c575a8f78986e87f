// pipit-chaos: a seeded, bounded chaos session for distributed training, or a soak.
//   pipit-chaos --seed 7 --faults 30          train_gpt over pipit-worker processes (beside
//                                             this program), faults injected, judged against
//                                             an uninterrupted run (tools/chaos/driver.h)
//   pipit-chaos --soak-steps 5000             RSS and descriptors over a long run
//                                             (tools/chaos/soak.h)
// Everything runs on 127.0.0.1 under a fresh work directory, every process started is killed
// at the end, and the exit status says whether every check held. Run as root, it mounts a
// small tmpfs for the checkpoints so that it can fill it; without, that fault is skipped.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "support/flags.h"
#include "tools/chaos/driver.h"
#include "tools/chaos/roles.h"
#include "tools/chaos/soak.h"

using namespace pipit::chaos;
namespace fs = std::filesystem;

namespace {

std::vector<FaultKind> parse_kinds(const std::string& text) {
  if (text == "default" || text == "all") return default_fault_kinds();
  std::vector<FaultKind> kinds;
  for (size_t begin = 0; begin < text.size();) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    kinds.push_back(parse_fault_kind(text.substr(begin, comma - begin)));
    begin = comma + 1;
  }
  return kinds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--chaos-role") == 0) return role_main(argc, argv);
  pipit::support::Flags flags("pipit-chaos",
                              "Injects seeded faults into distributed training, or soaks it.");
  flags.add("seed", "1", "picks the faults, their targets and their moments");
  flags.add("faults", "10", "faults to inject");
  std::string names;
  for (const char* name : kFaultNames) names += (names.empty() ? "" : ", ") + std::string(name);
  flags.add("kinds", "default",
            "comma-separated fault kinds, 'default' or 'all' (the same: every kind): " + names);
  flags.add("steps", "60", "training steps of the run");
  flags.add("checkpoint-every", "4", "steps between checkpoints");
  flags.add("workers", "3", "worker processes (pipeline stages)");
  flags.add("programs", "tools",
            "tools: train_gpt and pipit-worker from --bin-dir; roles: this program's built-in "
            "trainer and worker (what tests/chaos_test.cpp uses)");
  flags.add("bin-dir", "", "where train_gpt and pipit-worker are (default: beside this program)");
  flags.add("dir", "", "work directory (default: a fresh one under /tmp, removed on success)");
  flags.add("peer-timeout-ms", "2000", "peer timeout of the trainer and the workers");
  flags.add("heartbeat-ms", "250", "heartbeat interval");
  flags.add("step-timeout-ms", "8000", "the trainer's step timeout");
  flags.add("slack-ms", "2000", "added to every timeout a fault is judged by (a loaded machine)");
  flags.add("max-seconds", "1800", "the session gives up after this long");
  flags.add("tmpfs-kib", "4096", "size of the checkpoint tmpfs (0: a plain directory)");
  flags.add("model", "--layers 2 --heads 2 --width 16 --context 16 --batch 8 --microbatches 4",
            "model flags passed to the trainer");
  flags.add("soak-steps", "0", "run a soak of this many steps instead of chaos");
  flags.add("soak-rss-kib", "2048", "the soak's RSS growth allowed after the warm-up");
  flags.parse(argc, argv);

  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string bin_dir =
      flags.str("bin-dir").empty() ? fs::path(self).parent_path().string() : flags.str("bin-dir");
  const bool own_dir = flags.str("dir").empty();
  const std::string dir =
      own_dir ? "/tmp/pipit-chaos-" + std::to_string(getpid()) : flags.str("dir");
  ClusterOptions cluster;
  cluster.programs = flags.choice("programs", {"tools", "roles"}) == "roles"
                         ? Programs::roles(self)
                         : Programs::tools(bin_dir);
  cluster.dir = dir;
  cluster.workers = static_cast<int>(flags.integer("workers"));
  cluster.peer_timeout = std::chrono::milliseconds(flags.integer("peer-timeout-ms"));
  cluster.heartbeat = std::chrono::milliseconds(flags.integer("heartbeat-ms"));
  cluster.step_timeout = std::chrono::milliseconds(flags.integer("step-timeout-ms"));
  cluster.connect_timeout = cluster.peer_timeout * 4;
  for (size_t begin = 0; begin < flags.str("model").size();) {
    const std::string& model = flags.str("model");
    const size_t space = std::min(model.find(' ', begin), model.size());
    if (space > begin) cluster.trainer_args.push_back(model.substr(begin, space - begin));
    begin = space + 1;
  }
  bool ok = false;
  try {
    if (flags.integer("soak-steps", 0) > 0) {
      SoakOptions options;
      options.cluster = cluster;
      options.steps = flags.integer("soak-steps");
      options.rss_tolerance_kib = static_cast<long>(flags.integer("soak-rss-kib", 0));
      options.max_duration = std::chrono::seconds(flags.integer("max-seconds"));
      const SoakReport report = run_soak(options);
      std::printf("\nsoak: %lld steps, %d workers, %.0f s\n%s",
                  static_cast<long long>(options.steps), cluster.workers, report.seconds,
                  report.samples.empty() ? "" : report.table().c_str());
      for (const std::string& failure : report.failures)
        std::printf("FAILED: %s\n", failure.c_str());
      ok = report.failures.empty();
    } else {
      ChaosOptions options;
      options.cluster = cluster;
      fs::create_directories(dir);
      auto log_file = std::make_shared<std::ofstream>(dir + "/chaos.log");
      options.log = [log_file](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
        *log_file << line << "\n" << std::flush;
      };
      options.seed = static_cast<uint64_t>(flags.integer("seed", 0));
      options.faults = static_cast<int>(flags.integer("faults", 0));
      options.kinds = parse_kinds(flags.str("kinds"));
      options.steps = flags.integer("steps");
      options.checkpoint_every = flags.integer("checkpoint-every");
      options.tmpfs_bytes = static_cast<size_t>(flags.integer("tmpfs-kib", 0)) << 10;
      options.slack = std::chrono::milliseconds(flags.integer("slack-ms", 0));
      options.max_duration = std::chrono::seconds(flags.integer("max-seconds"));
      const ChaosReport report = ChaosSession(options).run();
      std::printf("\nchaos: seed %llu, %zu faults planned, %.0f s\n%s",
                  static_cast<unsigned long long>(report.seed), report.faults.size(),
                  report.seconds, report.table().c_str());
      for (const std::string& note : report.notes) std::printf("note: %s\n", note.c_str());
      std::printf("final checkpoint vs the uninterrupted run: %s\n",
                  report.final_versus_reference.empty() ? "identical, bit for bit"
                                                        : report.final_versus_reference.c_str());
      for (const std::string& failure : report.all_failures()) {
        std::printf("FAILED: %s\n", failure.c_str());
      }
      ok = report.ok();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipit-chaos: %s\n", e.what());
  }
  if (ok && own_dir) {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  } else {
    std::printf("logs kept in %s\n", dir.c_str());
  }
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
