// Generation on a pipelined model (pipeline/generation/pipelined_generation.h): the stages keep
// their chunks' KV caches and pass each step's activations on; the tokens equal generate() on the
// whole model, greedy and sampled, for every placement of the chunks, in threads and over
// worker processes, and training goes on afterwards as if nothing had run.
#include <catch2/catch.hpp>

#include "distributed_reference.h"
#include "pipeline/generation/pipelined_generation.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "serialize/hf_gpt2.h"

using namespace pipit;
using namespace pipit::testing;

namespace {

const std::string kTied = std::string(PIPIT_TEST_DATA) + "/hf_gpt2/tied";

// Three prompts of different lengths: the batch is left-padded.
const std::vector<std::vector<int64_t>> kPrompts = {{1, 2, 3, 4, 5, 6, 7}, {300, 17}, {42, 9, 8}};

PipelineConfig config(const std::string& schedule, int p, int v) {
  PipelineConfig c;
  c.stages = p;
  c.microbatches = 2;
  c.chunks_per_stage = v;
  c.schedule = schedule;
  c.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

GenerationOptions options(bool sample) {
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.sample = sample;
  o.temperature = 1.5;
  o.top_k = 50;
  o.seed = 7;
  return o;
}

Batch token_batch() {
  return testing::sequence_batch(4, 8,
                                 {.vocab = 512, .step = 37, .target_step = 37, .target_offset = 5});
}

}  // namespace

TEST_CASE("pipelined generation equals generation on the whole model", "[pipelined_generation]") {
  auto whole = load_hf_gpt2(kTied);
  const auto greedy = generate(*whole, kPrompts, options(false));
  const auto sampled = generate(*whole, kPrompts, options(true));
  REQUIRE(greedy != sampled);
  struct Case {
    std::string schedule;
    int p, v;
  };
  for (const auto& [schedule, p, v] : std::vector<Case>{{"1f1b", 1, 1},
                                                        {"1f1b", 2, 1},
                                                        {"1f1b", 3, 1},
                                                        {"interleaved", 2, 2},
                                                        {"zbv", 2, 2},
                                                        {"zbv", 3, 2}}) {
    INFO(schedule << " p=" << p << " v=" << v);
    auto model = load_hf_gpt2(kTied);
    Pipeline pipeline(model, config(schedule, p, v));
    CHECK(generate(pipeline.coordinator(), *model, kPrompts, options(false)) == greedy);
    CHECK(generate(pipeline.coordinator(), *model, kPrompts, options(true)) == sampled);
  }
}

TEST_CASE("training after pipelined generation is training as if it had not run",
          "[pipelined_generation]") {
  const Batch batch = token_batch();
  // The same dropout streams in both (each Dropout seeds itself from the default generator).
  default_generator().manual_seed(1);
  auto plain = load_hf_gpt2(kTied);
  default_generator().manual_seed(1);
  auto generated = load_hf_gpt2(kTied);
  Pipeline a(plain, config("1f1b", 2, 1)), b(generated, config("1f1b", 2, 1));
  generate(b.coordinator(), *generated, kPrompts, options(true));
  for (int step = 0; step < 2; ++step) {
    CHECK(a.train_step(batch.input, batch.target) == b.train_step(batch.input, batch.target));
  }
  // And generation after training sees the trained weights.
  CHECK(generate(b.coordinator(), *generated, kPrompts, options(false)) ==
        generate(*generated, kPrompts, options(false)));
}

TEST_CASE("pipelined generation over worker processes equals the whole model",
          "[pipelined_generation][distributed]") {
  Workers workers = start_workers(3, test_worker());
  auto whole = load_hf_gpt2(kTied);
  const auto greedy = generate(*whole, kPrompts, options(false));
  for (const auto& [schedule, v] :
       std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"zbv", 2}}) {
    INFO(schedule);
    auto model = load_hf_gpt2(kTied);
    Pipeline pipeline(model, config(schedule, 3, v), Launch::workers(endpoints(workers)));
    INFO(logs(workers));
    CHECK(generate(pipeline.coordinator(), *model, kPrompts, options(false)) == greedy);
  }
}
