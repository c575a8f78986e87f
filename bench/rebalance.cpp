// Automatic rebalancing, measured: p = 4 stages, uniform partition at the start, under three
// imbalances: stage 2 slowed 2x, stage 2 slowed 4x (its layers stretched, as on a slower
// machine), and a model whose embedding and head outweigh its blocks. Two kinds of model:
//  - sleep-cost layers shaped like a 16-block GPT (support/sleep_layer.h), in threads and
//    across worker processes (this program in its worker role, which knows SleepLayer):
//    layers that wait instead of computing, so 4 stages do not compete for this machine's
//    cores and the step time is the pipeline's own, as on separate machines;
//  - a real 16-block GPT, in threads and across pipit-worker processes: on a machine with
//    fewer cores than stages the stages also wait for cores, which no partition removes.
//    The same real GPT with every stage stretched 3x (and stage 2 a further 2x or 4x) needs
//    at most 4/3 cores, so on 2 cores its stages compute as on 4 slower machines.
// For each: the step time with the uniform partition (no rebalancing), after automatic
// rebalancing (the last 10 steps), and the step time the fitted cost model predicts for the
// partition it chose (its optimum); the steps until the last remap, whether a remap was
// undone because steps got slower (RemapTrial), the remap pause and the bytes moved. Printed as a
// table and appended to bench/RESULTS.md. usage: rebalance [--steps 40] [--no-append] [--only TEXT]
// (rebalance --worker FLAGS is the worker role, started by the benchmark itself.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "bench/results.h"
#include "codec/atomic_file.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/host.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/sleep_layer.h"
#include "support/worker_process.h"

using namespace pipit;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kStages = 4, kMicrobatches = 8;

struct Batch {
  Tensor input, target;
};

struct Scenario {
  std::string name, model_name;
  std::function<std::shared_ptr<Sequential>()> model;
  Batch batch;
  nlohmann::json loss;
  std::vector<double> slowdown;  // per stage
  bool sleep_cost = false;       // its workers must know SleepLayer: this program's worker role
};

Batch gpt_batch(const GptConfig& model) {
  Generator generator(7);
  const int64_t rows = 2 * kMicrobatches;
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < rows * model.context; ++i) {
    x.push_back(static_cast<int64_t>(generator.bits(generator.reserve(1)) % model.vocab_size));
    y.push_back(static_cast<int64_t>(generator.bits(generator.reserve(1)) % model.vocab_size));
  }
  return {from_vector(x, {rows, model.context}), from_vector(y, {rows, model.context})};
}

// Sleep-cost layers shaped like a GPT: an embedding, 16 blocks and a head, forward costs in
// microseconds (backward twice that).
std::shared_ptr<Sequential> sleep_gpt(int64_t embedding_us, int64_t block_us, int64_t head_us) {
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<support::SleepLayer>(embedding_us));
  for (int i = 0; i < 16; ++i) model->push_back(std::make_shared<support::SleepLayer>(block_us));
  model->push_back(std::make_shared<support::SleepLayer>(head_us));
  return model;
}

struct Result {
  double uniform_ms = 0, after_ms = 0, predicted_ms = 0;
  // From the last 10 steps' layer times: the optimal partition's predicted step time, and
  // whether the final partition is that one.
  double optimum_ms = 0;
  bool final_is_optimum = false;
  int remaps = 0;
  bool undone = false;  // a remap made steps slower and was undone (RemapTrial)
  int64_t last_remap_step = 0;
  double pause_ms = 0, moved_mb = 0;
  std::string final_ranges;
};

// Runs `steps` steps on a pipeline built by `make(rebalance)`: the uniform run first, then
// the rebalancing one.
template <typename Make>
Result measure(const Scenario& scenario, int steps, Make make) {
  const std::vector<std::string> kinds = layer_kinds(*scenario.model());
  std::vector<LayerCosts> last_costs;
  const Batch& b = scenario.batch;
  Result result;
  auto step_ms = [&](auto& pipeline) {
    const auto start = Clock::now();
    pipeline.train_step(b.input, b.target);
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  {
    auto pipeline = make(false);
    std::vector<double> times;
    for (int step = 0; step < 12; ++step) {
      const double ms = step_ms(*pipeline);
      if (step >= 2) times.push_back(ms);
    }
    result.uniform_ms = bench::median(times);
  }
  auto pipeline = make(true);
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    const double ms = step_ms(*pipeline);
    const StepStats& stats = pipeline->coordinator().last_step();
    if (stats.rebalance_verdict.rfind("rebalancing stopped", 0) == 0) result.undone = true;
    if (stats.rebalanced) {
      ++result.remaps;
      result.last_remap_step = step + 1;
      result.pause_ms = std::max(result.pause_ms, stats.remap_ms);
      result.moved_mb += stats.rebalanced->migration.bytes / 1e6;
      result.predicted_ms = stats.rebalanced->new_slowest_ms * (kMicrobatches + kStages - 1);
    }
    if (step >= steps - 10) {
      times.push_back(ms);
      if (!stats.layers.empty()) last_costs.push_back(layer_costs(stats, kMicrobatches));
    }
  }
  result.after_ms = bench::median(times);
  const std::vector<LayerRange> final_ranges = pipeline->chunk_ranges();
  result.final_ranges = ranges_str(final_ranges);
  if (last_costs.empty()) return result;
  const LayerCosts medians = median_layer_costs(last_costs);
  const CostModel model =
      CostModel::fit(kinds, final_ranges, kStages, medians, RebalanceConfig{}.link_ms_per_mb);
  const std::vector<LayerRange> optimum =
      optimal_partition(model, final_ranges, medians.state_bytes);
  result.optimum_ms = predict_step_ms(model, optimum, kMicrobatches);
  result.final_is_optimum = optimum == final_ranges;
  return result;
}

PipelineConfig config_for(const Scenario& scenario, bool rebalance) {
  PipelineConfig c;
  c.loss = scenario.loss;
  c.stages = kStages;
  c.microbatches = kMicrobatches;
  c.schedule = "1f1b";
  c.partition = "uniform";
  c.optimizer = {{"type", "AdamW"}, {"lr", 1e-3}};
  c.rebalance.enabled = rebalance;
  c.rebalance.window = 4;
  c.rebalance.cooldown = 3;
  return c;
}

}  // namespace

int run(int argc, char** argv) {
  support::Flags flags("rebalance", "Automatic layer rebalancing against the fitted optimum.");
  flags.add("steps", "40", "training steps per row (>= 20)");
  bench::add_no_append_flag(flags);
  flags.add("only", "", "run only the rows whose \"imbalance | model | stages in\" contains this");
  flags.parse(argc, argv);
  const int steps = static_cast<int>(flags.integer("steps", 20));
  const bool append = !flags.on("no-append");
  const std::string only = flags.str("only");
  set_num_threads(1);
  support::register_sleep_layer();
  const GptConfig blocks{65, 32, 16, 4, 64, 0.0};
  const GptConfig heavy_ends{8192, 32, 16, 4, 64, 0.0};
  const Batch sleep_batch{zeros({2 * kMicrobatches, 4}), zeros({2 * kMicrobatches, 4})};
  const nlohmann::json mse = {{"type", "MSELoss"}}, cross_entropy = {{"type", "CrossEntropyLoss"}};
  auto gpt_of = [](GptConfig config) {
    return [config] {
      Generator generator(5);
      return gpt(config, &generator);
    };
  };
  auto sleepers = [](int64_t embedding_us, int64_t block_us, int64_t head_us) {
    return [=] { return sleep_gpt(embedding_us, block_us, head_us); };
  };
  const std::string blocks_shape =
      "sleep-cost GPT shape: embedding 100 us, 16 blocks 300 us, head 600 us";
  const std::string heavy_shape =
      "sleep-cost GPT shape: embedding 2000 us, 16 blocks 300 us, head 4000 us";
  // Every stage stretched 3x, as on 4 machines each a third of one of this machine's cores:
  // their compute then fits in 2 cores, so stages rarely wait for a core, and the imbalance
  // (stage 2 stretched 2x or 4x more) is the cost model's to see.
  const std::string third_of_a_core = "every stage 3x slower (4 machines of 1/3 core)";
  const std::vector<Scenario> scenarios = {
      {"stage 2 slowed 2x",
       blocks_shape,
       sleepers(100, 300, 600),
       sleep_batch,
       mse,
       {1, 1, 2, 1},
       true},
      {"stage 2 slowed 4x",
       blocks_shape,
       sleepers(100, 300, 600),
       sleep_batch,
       mse,
       {1, 1, 4, 1},
       true},
      {"heavy embedding and head",
       heavy_shape,
       sleepers(2000, 300, 4000),
       sleep_batch,
       mse,
       {1, 1, 1, 1},
       true},
      {"stage 2 slowed 2x",
       "GPT, 16 blocks, width 64",
       gpt_of(blocks),
       gpt_batch(blocks),
       cross_entropy,
       {1, 1, 2, 1}},
      {"stage 2 slowed 4x",
       "GPT, 16 blocks, width 64",
       gpt_of(blocks),
       gpt_batch(blocks),
       cross_entropy,
       {1, 1, 4, 1}},
      {"heavy embedding and head",
       "GPT, 16 blocks, width 64, vocabulary 8192",
       gpt_of(heavy_ends),
       gpt_batch(heavy_ends),
       cross_entropy,
       {1, 1, 1, 1}},
      {"stage 2 slowed 2x",
       "GPT, 16 blocks, width 64, " + third_of_a_core,
       gpt_of(blocks),
       gpt_batch(blocks),
       cross_entropy,
       {3, 3, 6, 3}},
      {"stage 2 slowed 4x",
       "GPT, 16 blocks, width 64, " + third_of_a_core,
       gpt_of(blocks),
       gpt_batch(blocks),
       cross_entropy,
       {3, 3, 12, 3}},
      {"heavy embedding and head",
       "GPT, 16 blocks, width 64, vocabulary 8192, " + third_of_a_core,
       gpt_of(heavy_ends),
       gpt_batch(heavy_ends),
       cross_entropy,
       {3, 3, 3, 3}},
  };
  std::ostringstream table;
  table << "| imbalance | model | stages in | uniform ms/step | after rebalancing | predicted at "
           "remap | optimum, last 10 steps | after / optimum | final = optimum | steps to "
           "rebalance | remaps | undone | remap pause ms | pause / step | MB moved | final "
           "partition |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::printf("%s", table.str().c_str());
  for (const Scenario& scenario : scenarios) {
    for (const bool workers : {false, true}) {
      const std::string label = scenario.name + " | " + scenario.model_name + " | " +
                                (workers ? "4 worker processes" : "4 threads");
      if (label.find(only) == std::string::npos) continue;
      Result r;
      if (!workers) {
        r = measure(scenario, steps, [&](bool rebalance) {
          PipelineConfig c = config_for(scenario, rebalance);
          c.slowdown = scenario.slowdown;
          return std::make_unique<Pipeline>(scenario.model(), c);
        });
      } else {
        r = measure(scenario, steps, [&](bool rebalance) {
          // Fresh workers per run: each serves one run.
          static support::Workers pool;
          pool.clear();
          for (int s = 0; s < kStages; ++s) {
            pool.push_back(std::make_unique<support::WorkerProcess>(support::WorkerLaunch{
                .pipit_worker = !scenario.sleep_cost,
                .flags = {"--runs", "1", "--slowdown", std::to_string(scenario.slowdown[s])}}));
          }
          return std::make_unique<Pipeline>(scenario.model(), config_for(scenario, rebalance),
                                            Launch::workers(support::endpoints(pool)));
        });
      }
      char row[1024];
      std::snprintf(
          row, sizeof row,
          "| %s | %.1f | %.1f | %.1f | %.1f | %.2f | %s | %lld | %d | %s | %.1f | "
          "%.2f | %.2f | %s |\n",
          label.c_str(), r.uniform_ms, r.after_ms, r.predicted_ms, r.optimum_ms,
          r.optimum_ms > 0 ? r.after_ms / r.optimum_ms : 0.0, r.final_is_optimum ? "yes" : "no",
          static_cast<long long>(r.last_remap_step), r.remaps, r.undone ? "yes" : "no", r.pause_ms,
          r.after_ms > 0 ? r.pause_ms / r.after_ms : 0.0, r.moved_mb, r.final_ranges.c_str());
      std::printf("%s", row);
      std::fflush(stdout);
      table << row;
    }
  }
  if (append) {
    std::ostringstream text;
    text << "`build/rebalance --steps " << steps << "`: p = 4, m = 8, 1F1B, batch 16, one "
         << "thread per kernel, uniform partition at the start, rebalancing window 4, "
         << "cooldown 3. Step times are medians (uniform: steps 3-12 of a run without "
         << "rebalancing; after: the last 10 of " << steps
         << "). Predicted at remap: the fitted cost model's slowest stage (its layers, its "
            "sends and, on the last stage, the loss it waits for) x (m + p - 1) for the "
            "partition it chose, from the window before the remap. Optimum: the same model "
            "fitted to the layer times of the last 10 steps, for the best partition under it. "
            "Sleep-cost layers wait instead of computing, so their 4 "
            "stages do not share this machine's cores (as on 4 machines); the real GPT's 4 "
            "stages do, unless every stage is 3x slower (4 machines of a third of a core: "
            "their compute fits in 2 cores).\n\n"
         << table.str();
    bench::append_results("rebalance", text.str());
  }
  return 0;
}

int main(int argc, char** argv) {
  if (support::worker_role_requested(argc, argv)) return support::worker_role_main(argc, argv);
  // Caught here so that unwinding stops every worker process the benchmark started.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rebalance: %s\n", e.what());
    return 1;
  }
}
