#pragma once
// The MPI tests' programs, run by mpirun from tests/mpi_test.cpp:
//   mpirun -np 3 pipit_tests --mpi-role exchange
//   mpirun -np P pipit_tests --mpi-role pipeline SCHEDULE   (SPMD pipeline vs in-process)
//   mpirun -np P pipit_tests --mpi-role replica-pipeline SCHEDULE [LAYOUT]
//     (P/2 stages x 2 replicas; LAYOUT: PipelineConfig::rank_layout, default stages)
//   mpirun -np P pipit_tests --mpi-role paired-replica-pipeline SCHEDULE
//     (the same, each stage's replicas summed by MPI_Iallreduce: MpiOptions::pair_replicas)
//   mpirun -np P pipit_tests --mpi-role sharded-replica-pipeline SCHEDULE   (ZeRO-1, paired)
//   mpirun -np 3 pipit_tests --mpi-role three-replica-pipeline SCHEDULE   (P/3 stages x 3 replicas)
//   mpirun -np 6 pipit_tests --mpi-role recomputed-three-replica-pipeline SCHEDULE
//     (the same, recomputing activations)
//   mpirun -np P pipit_tests --mpi-role matrix-pipeline SCHEDULE R RECOMPUTE SHARD
//     (P/R stages x R replicas (2 or 3); RECOMPUTE, SHARD: 0 or 1)
//   mpirun -np 2 pipit_tests --mpi-role pair-sum         (Communicator::start_pair_sum)
//   mpirun -np 2 pipit_tests --mpi-role mismatch            (rank 1 builds another model)
//   mpirun -np 5 pipit_tests --mpi-role ps OPTIMIZER        (2 shards, 3 workers, sync mode)
//   mpirun -np 4 pipit_tests --mpi-role ps-resume killed|resumed DIR   (shard 1 killed, resumed)
//   mpirun -np 3 pipit_tests --mpi-role killed              (rank 2 is killed while training)
//   mpirun -np 5 pipit_tests --mpi-role failing-worker      (worker 1 throws at its step 2)
//   mpirun -np 2 pipit_tests --mpi-role malformed           (rank 1 sends broken frames first)
//   mpirun -np 2 pipit_tests --mpi-role doorbells           (rank 1 rings rank 0)
// Endpoints: the coordinator (-1) and stage 0 on rank 0, stage r on rank r. Every endpoint
// sends every other one tensors of several dtypes and sizes (up to 8 MiB), from two threads
// at once, 200 messages each; receivers check every value, the sender, and that each
// sender's messages of one thread arrive in order; rank 1's frames checksum their tensors'
// bytes, the others' do not. Prints "rank R ok" or the first mismatch, and returns non-zero on
// any.
#ifdef PIPIT_WITH_MPI
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/all_reduce.h"
#include "comm/mpi/doorbells.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_frames.h"
#include "comm/mpi/mpi_job.h"
#include "mpi_evaluate_role.h"
#include "nn/builders.h"
#include "pipeline/generation/pipelined_generation.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "pipeline_models.h"
#include "pipit.h"
#include "ps/checkpoint.h"
#include "ps/launch.h"
#include "ps/mpi/mpi_ps.h"
#include "ps_reference.h"
#include "serialize/hf_gpt2.h"

namespace pipit::testing {

inline Tensor mpi_payload(int from, int to, int thread, int index) {
  const int64_t n = index % 50 == 0 ? (int64_t{1} << 21) : 1 + index % 7;  // some 8 MiB
  Tensor t = full({n}, from * 1000 + to * 10 + thread + index * 1e-3);
  return index % 3 == 0 ? t.to(DType::bf16) : t;
}

// Every rank builds the same MLP (seeded), rank r keeps stage r; rank 0 trains 3 steps and
// compares every weight with an in-process Pipeline of the same config, bit for bit, and
// prints "pipeline ok". `seed_of_rank_1` other than 5 makes rank 1 build another model, which
// start-up must catch.
// tied: a GPT whose head is tied to its embedding (pipeline/gradients/tied_parameters.h) instead of
// an MLP. replicas: that many copies of a size / replicas stage pipeline (stage e mod p of
// replica e / p on rank e), against the in-process Pipeline of the same layout.
inline int mpi_pipeline_role(const std::string& schedule, uint64_t seed_of_rank_1,
                             bool tied = false, int replicas = 1, bool shard_optimizer = false,
                             const std::string& rank_layout = "stages", bool pair_sums = false,
                             bool recompute = false) {
  // The job's own count, whoever started it (mpirun sets OMPI_COMM_WORLD_*, srun does not).
  const MpiJob job = mpi_job();
  const int rank = job.rank, size = job.world_size;
  auto make_model = [&](uint64_t seed) {
    Generator generator(seed);
    if (!tied) return mlp({6, 8, 8, 8, 8, 3}, "relu", &generator);
    GptConfig c{11, 6, 6, 2, 16, 0.0};
    c.tie_embeddings = true;
    c.head_bias = false;
    return gpt(c, &generator);
  };
  PipelineConfig config;
  config.stages = size / replicas;
  config.replicas = replicas;
  config.shard_optimizer = shard_optimizer;
  config.rank_layout = rank_layout;
  config.recompute = recompute ? "full" : "none";
  config.microbatches = replicas == 3 ? 1 : 4 / replicas;
  if (schedule == "interleaved" && config.microbatches % config.stages != 0) {
    config.microbatches = config.stages;  // interleaved 1F1B takes multiples of the stages
  }
  config.schedule = schedule;
  config.chunks_per_stage = schedule == "interleaved" || schedule == "zbv" ? 2 : 1;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  Generator data(9);
  const int64_t rows = replicas * config.microbatches * (replicas == 3 ? 3 : 2);
  Tensor x = randn({rows, 6}, &data);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back(i % 3);
  Tensor y = from_vector(labels, {rows});
  if (tied) {
    const Batch tokens = gpt_batch(11, 8, 6);
    x = tokens.input;
    y = tokens.target;
  }
  auto model = make_model(rank == 1 ? seed_of_rank_1 : 5);
  MpiOptions options;
  options.pair_replicas = pair_sums;
  Pipeline pipeline(model, config, Launch::mpi(options));
  std::printf("rank %d runs stage %d of replica %d\n", rank,
              pipeline.local_stages().at(0)->spec().stage,
              pipeline.local_stages().at(0)->spec().replica);
  std::fflush(stdout);
  // How many of this rank's gradient sums MPI_Iallreduce made (two replicas pair each stage).
  auto print_pair_sums = [&] {
    std::printf("rank %d pair sums %lld\n", rank, static_cast<long long>(pipeline.pair_sums()));
    std::fflush(stdout);
  };
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    print_pair_sums();
    return 0;
  }
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) losses.push_back(pipeline.train_step(x, y));
  const auto [got_weights, got_optimizer] = pipeline.coordinator().fetch_state();
  print_pair_sums();
  // In-process and with the whole optimizer on every replica: a sharded one gives the same bits.
  PipelineConfig reference_config = config;
  reference_config.shard_optimizer = false;
  Pipeline reference(make_model(5), reference_config);
  int mismatches = 0;
  for (int step = 0; step < 3; ++step) {
    mismatches += reference.train_step(x, y) != losses[static_cast<size_t>(step)];
  }
  const auto [want_weights, want_optimizer] = reference.coordinator().fetch_state();
  mismatches += got_optimizer.size() != want_optimizer.size();
  for (const StateDict* want : {&want_weights, &want_optimizer}) {
    const StateDict& got = want == &want_weights ? got_weights : got_optimizer;
    for (const auto& [name, value] : *want) {
      auto it = got.find(name);
      mismatches += it == got.end() || it->second.nbytes() != value.nbytes() ||
                    std::memcmp(it->second.contiguous().raw_data(), value.contiguous().raw_data(),
                                value.nbytes()) != 0;
    }
  }
  std::printf("pipeline %s (%zu weights, %zu optimizer tensors, %d mismatches)\n",
              mismatches == 0 ? "ok" : "FAILED", want_weights.size(), want_optimizer.size(),
              mismatches);
  return mismatches == 0 ? 0 : 1;
}

// Every rank one member of an all-reduce (comm/all_reduce.h) of 4099 values in 64-value
// segments, members listed from the last rank to the first; each rank checks the bits against
// adding every member's tensor in that order itself.
inline int mpi_all_reduce_role() {
  const int size = mpi_job().world_size;
  std::map<int, int> ranks;
  std::vector<int> members;
  for (int r = 0; r < size; ++r) {
    ranks[r] = r;
    members.insert(members.begin(), r);  // summed from the last rank to the first
  }
  auto transport = MpiTransport::start(ranks, MpiOptions{});
  const int rank = transport->rank();
  auto contribution = [](int member) {
    Generator generator(static_cast<uint64_t>(member) + 40);
    return randn({4099}, &generator) * std::pow(10.0, member % 4 - 1);
  };
  Tensor mine = contribution(rank);
  Tensor expected = contribution(members[0]).clone();
  for (size_t i = 1; i < members.size(); ++i) expected = expected + contribution(members[i]);
  all_reduce(*transport->endpoint(rank), members, mine, 3, 64);
  const bool same = std::memcmp(mine.raw_data(), expected.raw_data(), mine.nbytes()) == 0;
  transport->stop();
  std::printf("all-reduce %s on rank %d\n", same ? "ok" : "FAILED", rank);
  return same ? 0 : 1;
}

// Two ranks, one endpoint each, paired (MpiOptions::pair_sums). Rank 0 names its sums (1,0),
// (1,1), (2,0), (3,0) and rank 1 (1,0), (2,0), (2,1), (3,0), as after an aborted step each:
// (1,0), (2,0) and (3,0) must come back summed, each equal to adding both ranks' tensors here
// (f32 and f64), and the sums one side skipped never.
inline int mpi_pair_sum_role() {
  MpiOptions options;
  options.pair_sums = {{0, 1}};
  auto transport = MpiTransport::start({{0, 0}, {1, 1}}, options);
  const int rank = transport->rank(), peer = 1 - rank;
  auto comm = transport->endpoint(rank);
  auto contribution = [](int member, int64_t step, int part) {
    Generator generator(static_cast<uint64_t>(member * 100 + step * 10 + part));
    Tensor t = randn({1000 + part * 7}, &generator) * std::pow(10.0, member - 1);
    return step == 2 ? t.to(DType::f64) : t;
  };
  bool ok = comm->has_pair_sum(peer, DType::f32) && comm->has_pair_sum(peer, DType::f64) &&
            !comm->has_pair_sum(peer, DType::bf16) && !comm->has_pair_sum(rank, DType::f32);
  const std::vector<std::pair<int64_t, int>> names =
      rank == 0 ? std::vector<std::pair<int64_t, int>>{{1, 0}, {1, 1}, {2, 0}, {3, 0}}
                : std::vector<std::pair<int64_t, int>>{{1, 0}, {2, 0}, {2, 1}, {3, 0}};
  std::map<std::pair<int64_t, int>, Tensor> tensors;
  for (const auto& [step, part] : names) {
    tensors[{step, part}] = contribution(rank, step, part);
    comm->start_pair_sum(peer, tensors[{step, part}], step, part);
  }
  std::vector<std::pair<int64_t, int>> done;
  while (done.size() < 3) {
    const std::optional<Message> message = comm->try_receive(std::chrono::seconds(20));
    if (!message) break;
    if (message->kind == MessageKind::PairSumDone)
      done.emplace_back(message->step, message->microbatch);
  }
  ok = ok && done.size() == 3 && !comm->try_receive(std::chrono::milliseconds(300));
  for (const auto& [step, part] : done) {
    const Tensor expected = contribution(0, step, part) + contribution(1, step, part);
    const Tensor& got = tensors.at({step, part});
    ok = ok && part == 0 && got.nbytes() == expected.nbytes() &&
         std::memcmp(got.raw_data(), expected.raw_data(), got.nbytes()) == 0;
  }
  ok = ok && transport->pair_sums() == 3;
  transport->stop();
  std::printf("pair sums %s on rank %d (%zu done)\n", ok ? "ok" : "FAILED", rank, done.size());
  return ok ? 0 : 1;
}

// Greedy generation from tests/data/hf_gpt2/tied pipelined over the ranks, against the whole
// model on rank 0.
inline int mpi_generate_role(const std::string& schedule) {
  PipelineConfig config;
  config.stages = mpi_job().world_size;
  config.microbatches = 2;
  config.schedule = schedule;
  config.chunks_per_stage = schedule == "zbv" ? 2 : 1;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  const std::string dir = std::string(PIPIT_TEST_DATA) + "/hf_gpt2/tied";
  auto model = load_hf_gpt2(dir);
  Pipeline pipeline(model, config, Launch::mpi());
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    return 0;
  }
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5, 6, 7}, {300, 17}};
  GenerationOptions options;
  options.max_new_tokens = 12;
  const bool same = generate(pipeline.coordinator(), *model, prompts, options) ==
                    generate(*load_hf_gpt2(dir), prompts, options);
  std::printf("generate %s\n", same ? "ok" : "FAILED");
  return same ? 0 : 1;
}

// Sync-mode parameter-server training over MPI, ranks 0-1 the shards and 2-4 the workers,
// against single-process training on each step's large batch: each shard's weights and each
// worker's losses bit for bit. Prints "ps rank R ok" or what differs.
inline int mpi_ps_role(const std::string& optimizer_name) {
  const nlohmann::json& optimizer = optimizer_name == "adamw" ? kAdamW : kSgd;
  const PsTask task(512);
  const PsConfig config = ps_config_of("sync", kSyncWorkers, 2, optimizer);
  PsRunOptions options;
  options.steps = kSyncSteps;
  options.batch = [&](int w, int64_t step) { return task.batch(kSyncWorkers, w, step); };
  const int rank = mpi_job().rank;
  const PsRunReport report = train_ps(*make_ps_mlp(), config, options, PsLaunch::mpi());
  const auto [want, losses] = large_batch_reference(optimizer, task);
  const MpiPsRole role = pipit::mpi_ps_role(config, rank);
  std::string differ;
  if (role.server) {
    for (const auto& [name, value] : report.weights) {
      if (!want.count(name) || !bitwise_equal(value, want.at(name))) differ += " " + name;
    }
    if (report.weights.empty() || report.servers[role.index].version != kSyncSteps) {
      differ += " (no weights or wrong version)";
    }
  } else if (report.losses[role.index] != losses[role.index]) {
    differ += " losses";
  }
  std::printf("ps rank %d %s%s\n", rank, differ.empty() ? "ok" : "FAILED:", differ.c_str());
  return differ.empty() ? 0 : 1;
}

// Sync parameter-server training as 4 ranks (2 shards, 2 workers) for kPsResumeSteps steps,
// checkpointing to `dir` every 5 updates. "killed": shard 1's rank kills itself once it has
// saved version 10 (mpirun ends the job). "resumed": the run resumes from `dir`; each shard
// checks its weights against the unbroken run's and prints "ps-resumed rank R ok".
inline int mpi_ps_resume_role(const std::string& how, const std::string& dir) {
  const PsTask task(512);
  const PsConfig config = ps_config_of("sync", 2, 2, kSgd);
  PsRunOptions options;
  options.steps = kPsResumeSteps;
  options.batch = [&](int w, int64_t step) { return task.batch(2, w, step); };
  options.checkpoint_dir = dir;
  options.checkpoint_every = 5;
  options.resume = how == "resumed";
  const int rank = mpi_job().rank;
  std::optional<OnCheckpoint> kill;
  if (how == "killed" && rank == 1) {
    kill.emplace(shard_checkpoint_path(dir, 1, 2), 10, [] { std::raise(SIGKILL); });
  }
  const PsRunReport report = train_ps(*make_ps_mlp(), config, options, PsLaunch::mpi());
  if (how != "resumed" || rank >= config.servers) return 0;
  const StateDict want = large_batch_reference(kSgd, task, 2, kPsResumeSteps).first;
  std::string differ;
  for (const auto& [name, value] : report.weights) {
    if (!bitwise_equal(value, want.at(name))) differ += " " + name;
  }
  if (report.weights.empty() || report.servers[rank].version != kPsResumeSteps) {
    differ += " (no weights or wrong version)";
  }
  std::printf("ps-resumed rank %d %s%s\n", rank, differ.empty() ? "ok" : "FAILED:", differ.c_str());
  return differ.empty() ? 0 : 1;
}

// A 3-stage pipeline that trains until rank 2 (stage 2) is killed, a second in: mpirun must
// end the job.
inline int mpi_killed_role() {
  Generator generator(5);
  auto model = mlp({6, 8, 8, 3}, "relu", &generator);
  PipelineConfig config;
  config.stages = 3;
  config.microbatches = 4;
  Pipeline pipeline(model, config, Launch::mpi());
  std::printf("rank %d: stage %d\n", pipeline.rank(), pipeline.rank());
  std::fflush(stdout);
  if (pipeline.rank() == 2) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::raise(SIGKILL);
    }).detach();
  }
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    return 0;
  }
  Generator data(9);
  const Tensor x = randn({8, 6}, &data);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  for (int step = 0; step < 10000000; ++step) pipeline.train_step(x, y);
  return 0;
}

// Worker 1 fails at its third step; the shards and the other workers would wait for it.
inline int mpi_failing_worker_role() {
  const PsTask task(512);
  PsRunOptions options;
  options.steps = 1000;
  options.batch = [&](int w, int64_t step) {
    PIPIT_CHECK(w != 1 || step < 2, "worker 1 cannot read its batch at step ", step);
    return task.batch(kSyncWorkers, w, step);
  };
  train_ps(*make_ps_mlp(), ps_config_of("sync", kSyncWorkers, 2, kSgd), options, PsLaunch::mpi());
  return 0;
}

inline int mpi_exchange_role();

// Rank 1 sends rank 0, with raw MPI before its transport starts, a head too short for its
// route, a head with a bad magic whose route announces a 100-byte body (sent too) and a frame
// with a tensor byte changed under its checksum, then a real message through its transport.
// Rank 0 must drop the three broken frames, naming why, and receive the real one with its own
// body: "malformed ok".
inline int mpi_malformed_role() {
  const int rank = mpi_job().rank;
  if (rank == 1) {
    const std::string short_head(10, 'x');
    std::string bad_head(16 + kFrameHeaderSize, '\0');
    const int32_t endpoints[2] = {1, 0};
    const uint64_t body_bytes = 100;
    std::memcpy(bad_head.data(), endpoints, 8);
    std::memcpy(bad_head.data() + 8, &body_bytes, 8);
    const std::string body(body_bytes, 'b');
    // A frame whose checksum covers its tensors, one tensor byte changed after encoding.
    const uint64_t inlined = 0;
    std::string route(16, '\0');
    std::memcpy(route.data(), endpoints, 8);
    std::memcpy(route.data() + 8, &inlined, 8);
    std::string changed =
        encode_frame_parts(Message(PipelineKind::Activation, 9, 0, 0, {arange(0, 300, 1)}),
                           /*checksum_tensor_bytes=*/true)
            .joined(route);
    changed.back() = static_cast<char>(changed.back() ^ 1);
    MPI_Send(short_head.data(), 10, MPI_BYTE, 0, kHeadTag, MPI_COMM_WORLD);
    MPI_Send(bad_head.data(), static_cast<int>(bad_head.size()), MPI_BYTE, 0, kHeadTag,
             MPI_COMM_WORLD);
    MPI_Send(body.data(), static_cast<int>(body.size()), MPI_BYTE, 0, kBodyTag, MPI_COMM_WORLD);
    MPI_Send(changed.data(), static_cast<int>(changed.size()), MPI_BYTE, 0, kHeadTag,
             MPI_COMM_WORLD);
  }
  auto transport = MpiTransport::start({{0, 0}, {1, 1}});
  auto comm = transport->endpoint(rank);
  const Tensor payload = arange(0, 300, 1);
  bool ok = true;
  if (rank == 1) {
    comm->send(0, Message(PipelineKind::Activation, 4, 0, 0, {payload}));
  } else {
    const std::optional<Message> m = comm->try_receive(std::chrono::seconds(30));
    ok = m && m->step == 4 && m->from == 1 && m->tensors.size() == 1 &&
         m->tensors[0].shape() == payload.shape() &&
         std::memcmp(m->tensors[0].raw_data(), payload.raw_data(), payload.nbytes()) == 0;
    std::printf("malformed %s\n", ok ? "ok" : "FAILED: the real message did not arrive whole");
  }
  transport->stop();
  return ok ? 0 : 1;
}

// Rank 1 rings rank 0's doorbell while rank 0 sleeps on it, then once before rank 0 sleeps
// (a wait for the value read before that ring must return at once, not sleep through it);
// with no ring, a wait times out. Prints "doorbells ok".
inline int mpi_doorbells_role() {
  const MpiJob job = mpi_job();
  std::unique_ptr<NodeDoorbells> bells =
      NodeDoorbells::open(job.rank, job.world_size, job.local_size);
  bool ok = bells != nullptr;
  if (ok && job.rank == 0) {
    const uint32_t before_first = bells->seen();
    MPI_Barrier(MPI_COMM_WORLD);
    ok = bells->wait(before_first, std::chrono::seconds(30));
    const uint32_t before_second = bells->seen();
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);  // rank 1 rang between the two
    const auto start = std::chrono::steady_clock::now();
    ok = ok && bells->wait(before_second, std::chrono::seconds(30));
    ok = ok && std::chrono::steady_clock::now() - start < std::chrono::seconds(10);  // not slept
    ok = ok && !bells->wait(bells->seen(), std::chrono::milliseconds(20));
    std::printf("doorbells %s\n", ok ? "ok" : "FAILED");
  } else if (ok) {
    MPI_Barrier(MPI_COMM_WORLD);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 is asleep by now
    bells->ring(0);
    MPI_Barrier(MPI_COMM_WORLD);
    bells->ring(0);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}

//   --mpi-role exchange | pipeline SCHEDULE | tied-pipeline SCHEDULE |
//   tied-replica-pipeline SCHEDULE | generate SCHEDULE |
//   all-reduce | pair-sum | replica-pipeline SCHEDULE [LAYOUT] | paired-replica-pipeline SCHEDULE |
//   sharded-replica-pipeline SCHEDULE | three-replica-pipeline SCHEDULE |
//   recomputed-three-replica-pipeline SCHEDULE | matrix-pipeline SCHEDULE R RECOMPUTE SHARD |
//   mismatch | ps OPTIMIZER | ps-resume killed|resumed DIR | evaluate |
//   killed | failing-worker | malformed | doorbells
inline int mpi_role_main(int argc, char** argv) {
  const std::string role = argc >= 3 ? argv[2] : "";
  try {
    if (role == "exchange") return mpi_exchange_role();
    if (role == "pipeline" && argc == 4) return mpi_pipeline_role(argv[3], 5);
    if (role == "tied-pipeline" && argc == 4) return mpi_pipeline_role(argv[3], 5, true);
    if (role == "tied-replica-pipeline" && argc == 4) {
      return mpi_pipeline_role(argv[3], 5, true, 2);
    }
    if (role == "replica-pipeline" && argc == 4) return mpi_pipeline_role(argv[3], 5, false, 2);
    if (role == "paired-replica-pipeline" && argc == 4) {
      return mpi_pipeline_role(argv[3], 5, false, 2, false, "stages", true);
    }
    if (role == "replica-pipeline" && argc == 5) {
      return mpi_pipeline_role(argv[3], 5, false, 2, false, argv[4]);
    }
    if (role == "sharded-replica-pipeline" && argc == 4) {
      return mpi_pipeline_role(argv[3], 5, false, 2, true, "stages", true);
    }
    if (role == "three-replica-pipeline" && argc == 4) {
      return mpi_pipeline_role(argv[3], 5, false, 3);
    }
    if (role == "matrix-pipeline" && argc == 7) {
      return mpi_pipeline_role(argv[3], 5, false, std::atoi(argv[4]), std::string(argv[6]) == "1",
                               "stages", false, std::string(argv[5]) == "1");
    }
    if (role == "recomputed-three-replica-pipeline" && argc == 4) {
      return mpi_pipeline_role(argv[3], 5, false, 3, false, "stages", false, true);
    }
    if (role == "pair-sum") return mpi_pair_sum_role();
    if (role == "generate" && argc == 4) return mpi_generate_role(argv[3]);
    if (role == "evaluate") return mpi_evaluate_role();
    if (role == "all-reduce") return mpi_all_reduce_role();
    if (role == "mismatch") return mpi_pipeline_role("1f1b", 6);
    if (role == "ps" && argc == 4) return mpi_ps_role(argv[3]);
    if (role == "ps-resume" && argc == 5) return mpi_ps_resume_role(argv[3], argv[4]);
    if (role == "killed") return mpi_killed_role();
    if (role == "failing-worker") return mpi_failing_worker_role();
    if (role == "malformed") return mpi_malformed_role();
    if (role == "doorbells") return mpi_doorbells_role();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi role %s: %s\n", role.c_str(), e.what());
    return 1;
  }
  return 2;
}

inline int mpi_exchange_role() {
  MpiOptions options;
  options.checksum_tensor_bytes = mpi_job().rank == 1;
  auto transport = MpiTransport::start({{-1, 0}, {0, 0}, {1, 1}, {2, 2}}, options);
  const int rank = transport->rank();
  if (transport->world_size() != 3) {
    std::fprintf(stderr, "rank %d: the exchange needs 3 ranks, got %d\n", rank,
                 transport->world_size());
    return 2;
  }
  std::vector<int> mine = rank == 0 ? std::vector<int>{-1, 0} : std::vector<int>{rank};
  const std::vector<int> all = {-1, 0, 1, 2};
  constexpr int kThreads = 2, kMessages = 200;
  int failures = 0;
  std::vector<std::thread> threads;
  std::mutex mutex;
  for (int me : mine) {
    auto comm = transport->endpoint(me);
    for (int thread = 0; thread < kThreads; ++thread) {
      threads.emplace_back([comm, me, thread, &all] {
        for (int index = 0; index < kMessages; ++index) {
          for (int to : all) {
            if (to == me) continue;
            comm->send(to, Message(PipelineKind::Activation, index, thread, 0,
                                   {mpi_payload(me, to, thread, index)}));
          }
        }
      });
    }
    threads.emplace_back([comm, me, &all, &failures, &mutex] {
      std::map<std::pair<int, int>, int> next;  // (sender, thread) -> next index
      const int expected = (static_cast<int>(all.size()) - 1) * kThreads * kMessages;
      for (int received = 0; received < expected; ++received) {
        std::optional<Message> m = comm->try_receive(std::chrono::seconds(60));
        std::lock_guard<std::mutex> lock(mutex);
        if (!m) {
          std::fprintf(stderr, "endpoint %d: only %d of %d messages in time\n", me, received,
                       expected);
          ++failures;
          return;
        }
        const int thread = m->microbatch, index = static_cast<int>(m->step);
        int& want = next[{m->from, thread}];
        const Tensor expect = mpi_payload(m->from, me, thread, index);
        const bool same =
            m->tensors.size() == 1 && m->tensors[0].shape() == expect.shape() &&
            m->tensors[0].dtype() == expect.dtype() &&
            std::memcmp(m->tensors[0].raw_data(), expect.raw_data(), expect.nbytes()) == 0;
        if (index != want || !same) {
          std::fprintf(stderr, "endpoint %d: message %d of sender %d thread %d (wanted %d)%s\n", me,
                       index, m->from, thread, want, same ? "" : " has wrong values");
          ++failures;
        }
        want = index + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  transport->stop();
  std::printf("rank %d %s\n", rank, failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace pipit::testing
#endif
