#pragma once
// The two processes of a distributed run, built into an executable that is not train_gpt or
// pipit-worker: the test suite's ASan build has no samples or tools, so tests/chaos_test.cpp
// starts its own executable in these roles (tests/main.cpp dispatches --chaos-role).
//   --chaos-role worker  ...  pipit-worker's flags (support/worker_main.h): serves stages.
//   --chaos-role trainer ...  train_gpt's distributed flags (a subset): trains a tiny GPT on
//                             made-up tokens over --workers, with checkpoints and --resume,
//                             printing "step N loss L" lines and "chaos-trainer: ERROR" on
//                             failure (exit status 1), as train_gpt does.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "nn/builders.h"
#include "nn/registry.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/host.h"
#include "pipit.h"
#include "serialize/checkpoint.h"
#include "support/checkpoint_flags.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#include "support/run_flags.h"
#include "support/tcp_flags.h"
#include "support/worker_main.h"
#include "tensor/parallel.h"

namespace pipit::chaos {

inline int worker_role(int argc, char** argv) {
  return support::worker_main(argc, argv, "chaos-worker");
}

inline int trainer_role(int argc, char** argv) {
  support::Flags flags("chaos-trainer", "train_gpt's distributed flags, in the chaos roles.");
  flags.add("workers", "", "host:port,... of the workers, one per stage");
  support::add_checkpoint_flags(flags);
  flags.add("steps", "20", "optimizer steps");
  support::add_seed_flag(flags, "1", "weights, batches");
  support::add_gpt_flags(flags,
                         {.vocab_size = 13, .context = 8, .layers = 1, .heads = 2, .width = 16},
                         support::GptVocabulary::from_data);
  flags.add("batch", "4", "sequences per step");
  flags.add("microbatches", "2", "microbatches per batch");
  flags.add("lr", "0.003", "AdamW learning rate");
  support::add_threads_flag(flags, "1");
  flags.add("print-every", "1", "steps between progress lines");
  flags.add("sample", "0", "ignored (train_gpt's)");
  support::add_tcp_flags(flags, support::TcpSide::coordinator);
  flags.add("step-timeout-ms", "30000", "a step fails when no stage has answered for this long");
  flags.parse(argc, argv);
  try {
    set_num_threads(static_cast<int>(flags.integer("threads")));
    const std::vector<std::string> workers = flags.items("workers");
    const support::CheckpointFlags checkpoints = support::checkpoint_flags(flags);
    PIPIT_CHECK(!workers.empty() && !checkpoints.dir.empty(),
                "chaos-trainer needs --workers and --checkpoint-dir");
    const int64_t steps = flags.integer("steps"), every = checkpoints.every;
    const int64_t batch = flags.integer("batch");
    const int64_t print_every = flags.integer("print-every");
    GptConfig shape = support::gpt_config(flags);
    shape.vocab_size = 13;
    const int64_t vocab = shape.vocab_size, context = shape.context;
    const std::string& path = checkpoints.path;

    Generator generator(support::seed_flag(flags));
    auto model = gpt(shape, &generator);
    StateDict optimizer_state;
    int64_t first_step = 0;
    if (checkpoints.resume) {
      Checkpoint checkpoint = load_checkpoint(path);
      model = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
      PIPIT_CHECK(model != nullptr, "checkpoint '", path, "' holds no Sequential");
      model->load_state_dict(checkpoint.weights);
      optimizer_state = std::move(checkpoint.optimizer_state);
      first_step = checkpoint.step;
      generator.set_state(checkpoint.rng_seed, checkpoint.rng_offset);
      std::printf("resumed from %s at step %lld\n", path.c_str(),
                  static_cast<long long>(first_step));
    }
    PipelineConfig config;
    config.stages = static_cast<int>(workers.size());
    config.microbatches = static_cast<int>(flags.integer("microbatches"));
    config.optimizer = {{"type", "AdamW"}, {"lr", flags.number("lr")}};
    config.max_grad_norm = 1.0;
    config.timeout = std::chrono::milliseconds(flags.integer("step-timeout-ms"));
    const TcpOptions tcp = support::tcp_options(flags, support::TcpSide::coordinator);
    Pipeline pipeline(model, config, Launch::workers(workers, tcp), optimizer_state);
    std::printf("chaos-trainer: %lld parameters, %zu stages\n",
                static_cast<long long>(model->parameter_count()), workers.size());
    std::fflush(stdout);
    auto save = [&](int64_t steps_done) {
      auto [weights, optimizer] = pipeline.coordinator().fetch_state();
      save_checkpoint(path, {model->config(), weights, config.optimizer, optimizer, steps_done,
                             generator.seed(), generator.offset()});
    };
    for (int64_t step = first_step; step < steps; ++step) {
      // Random windows of a sequence with structure: token i is (3i + i/7) mod vocab.
      std::vector<int64_t> x, y;
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t start = static_cast<int64_t>(generator.bits(generator.reserve(1)) % 4096);
        for (int64_t t = start; t < start + context; ++t) {
          x.push_back((3 * t + t / 7) % vocab);
          y.push_back((3 * (t + 1) + (t + 1) / 7) % vocab);
        }
      }
      const double loss =
          pipeline.train_step(from_vector(x, {batch, context}), from_vector(y, {batch, context}));
      if ((step + 1) % print_every == 0 || step + 1 == steps) {
        std::printf("step %5lld  loss %.4f\n", static_cast<long long>(step + 1), loss);
        std::fflush(stdout);
      }
      if (every > 0 && (step + 1) % every == 0) save(step + 1);
    }
    save(std::max(first_step, steps));
    std::printf("checkpoint written to %s\n", path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chaos-trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Runs the role named after --chaos-role (argv[1] == "--chaos-role", argv[2] the role); the
// role's flags follow, for its own parser.
inline int role_main(int argc, char** argv) {
  support::Flags flags(std::filesystem::path(argv[0]).filename().string() + " --chaos-role",
                       "The chaos driver's processes of a distributed run.");
  flags.add_positional("ROLE", "worker or trainer");
  flags.parse(std::min(argc - 1, 2), argv + 1);
  const std::string role = flags.positional("ROLE");
  argv[2] = argv[0];
  if (role == "worker") return worker_role(argc - 2, argv + 2);
  if (role == "trainer") return trainer_role(argc - 2, argv + 2);
  flags.fail("unknown role '" + role + "'");
}

}  // namespace pipit::chaos
