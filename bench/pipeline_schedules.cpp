// Pipeline schedule benchmarks, printed as tables and appended to bench/RESULTS.md:
//  1. efficiency: stages built from layers that sleep (forward t, input gradient t, weight
//     gradient t, so stages do not compete for cores), measured step time vs the schedule's
//     theoretical and simulated time, and the stashed activations and deferred weight
//     gradients per stage;
//  2. overhead per task through the event loop and communicator, with zero-cost layers;
//  3. peak memory of every schedule on a GPT, with and without activation recomputation, from
//     the allocator's peak;
//  4. the efficiency and per-task overhead of 1 and 2 again with the stages in 4 worker
//     processes over TCP (this binary in its worker role), beside the same in threads: torch's
//     pipelining runs as processes (bench/pipeline_schedules_torch.py).
// usage: pipeline_schedules [--layer-ms 4] [--no-append]
// (pipeline_schedules --worker PORT_FILE SLOWDOWN is the worker role the benchmark starts.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include <sys/prctl.h>

#include "autograd/node.h"
#include "bench/results.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedules/schedule.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/sleep_layer.h"
#include "support/worker_process.h"
#include "tensor/cpu/cpu_allocator.h"

using namespace pipit;
using bench::median;
using support::SleepLayer;

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<Sequential> sleep_model(int layers, int64_t forward_us) {
  auto model = std::make_shared<Sequential>();
  for (int i = 0; i < layers; ++i) model->push_back(std::make_shared<SleepLayer>(forward_us));
  return model;
}

// `layers` sleeping layers behind a free one, which makes the model's input need a gradient, so
// that stage 0 splits its backward into I and W like every other stage; the free layer goes
// to chunk 0 on top of its share.
std::shared_ptr<Sequential> sleep_model_with_free_head(int layers, int64_t forward_us) {
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<SleepLayer>(0));
  for (int i = 0; i < layers; ++i) model->push_back(std::make_shared<SleepLayer>(forward_us));
  return model;
}

std::string joined(const std::vector<int>& values) {
  std::string text;
  for (int v : values) {
    if (!text.empty()) text.append(" ");
    text.append(std::to_string(v));
  }
  return text;
}

// Median wall time of `steps` train steps after one warm-up step, in microseconds.
template <typename AnyPipeline>
double step_time_us(AnyPipeline& pipeline, const Tensor& x, const Tensor& y, int steps) {
  pipeline.train_step(x, y);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    auto start = Clock::now();
    pipeline.train_step(x, y);
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return median(times);
}

int chunks_per_stage(const std::string& schedule) {
  return schedule == "interleaved" || schedule == "zbv" ? 2 : 1;
}

PipelineConfig mse_config(int p, int m, int v, const std::string& schedule) {
  PipelineConfig config;
  config.stages = p;
  config.microbatches = m;
  config.chunks_per_stage = v;
  config.schedule = schedule;
  config.loss = {{"type", "MSELoss"}};
  config.optimizer = {{"type", "SGD"}, {"lr", 0.0}};
  return config;
}

std::string efficiency_table(int64_t layer_us) {
  const int p = 4, layers = 8;
  std::ostringstream out;
  out << "Efficiency: p = 4, 8 sleeping layers of " << layer_us / 1000.0
      << " ms forward, input gradient and weight gradient each (F = I = W = "
      << 2 * layer_us / 1000.0
      << " ms per stage of 2 layers; B = I + W), median of 3 steps. Stashed: most activations "
         "per stage; deferred: most weight gradients waiting for their W\n\n"
      << "| schedule | m | v | theoretical ms | simulated ms | measured ms | efficiency | "
         "stashed | deferred |\n"
      << "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (int v : {1, 2}) {
    for (int m : {8, 16, 32}) {
      for (const auto& [schedule, max_deferred] :
           std::vector<std::pair<std::string, int>>{{"gpipe", 0},
                                                    {"1f1b", 0},
                                                    {"interleaved", 0},
                                                    {"zbh1", 0},
                                                    {"zbh2", 0},
                                                    {"zbv", 0},
                                                    {"zbv", 2}}) {
        if (chunks_per_stage(schedule) != v) continue;
        PipelineConfig config = mse_config(p, m, v, schedule);
        config.max_deferred = max_deferred;
        config.layer_counts.assign(static_cast<size_t>(p * v), layers / (p * v));
        config.layer_counts[0] += 1;
        Pipeline pipeline(sleep_model_with_free_head(layers, layer_us), config);
        Tensor x = zeros({m, 1}), y = zeros({m, 1});
        const double tf = 2.0 * layer_us, tb = 4.0 * layer_us;
        const double simulated =
            validate_schedule(make_schedule(schedule, p, m, v, "", max_deferred), p, m, v,
                              placement_of(schedule), tf, tb)
                .makespan;
        // A lowered max_deferred has no closed form: its theory is the simulation.
        const double theory =
            max_deferred > 0 ? simulated : theoretical_step_time(schedule, p, m, v, tf, tb);
        const std::string label =
            max_deferred > 0 ? schedule + " (max_deferred " + std::to_string(max_deferred) + ")"
                             : schedule;
        const double measured = step_time_us(pipeline, x, y, 3);
        const StepStats& stats = pipeline.coordinator().last_step();
        char row[320];
        std::snprintf(row, sizeof row, "| %s | %d | %d | %.1f | %.1f | %.1f | %.3f | %s | %s |\n",
                      label.c_str(), m, v, theory / 1000, simulated / 1000, measured / 1000,
                      theory / measured, joined(stats.peak_stashed).c_str(),
                      joined(stats.peak_deferred).c_str());
        out << row;
        std::fputs(row, stdout);
        std::fflush(stdout);
      }
    }
  }
  return out.str();
}

// One step of the efficiency experiment, traced, as a text timeline.
std::string efficiency_timeline(int64_t layer_us, const std::string& schedule, int m) {
  const int p = 4, layers = 8, v = chunks_per_stage(schedule);
  PipelineConfig config = mse_config(p, m, v, schedule);
  config.layer_counts.assign(static_cast<size_t>(p * v), layers / (p * v));
  config.layer_counts[0] += 1;
  config.trace = true;
  Pipeline pipeline(sleep_model_with_free_head(layers, layer_us), config);
  Tensor x = zeros({m, 1}), y = zeros({m, 1});
  pipeline.train_step(x, y);
  pipeline.coordinator().clear_trace();
  pipeline.train_step(x, y);
  return pipeline.coordinator().trace().timeline(layer_us);
}

std::string overhead_table() {
  std::ostringstream out;
  out << "\nOverhead per task with zero-cost layers (x * w on one element): step time divided "
         "by the tasks on the critical path (simulated with unit cost per task)\n\n"
      << "| schedule | p | m | v | step us | tasks on critical path | us per task |\n"
      << "| --- | --- | --- | --- | --- | --- | --- |\n";
  struct Row {
    std::string schedule;
    int p, m, v;
  };
  for (const Row& r : {Row{"1f1b", 1, 32, 1}, Row{"1f1b", 4, 32, 1}, Row{"gpipe", 4, 32, 1},
                       Row{"interleaved", 4, 32, 2}, Row{"zbh1", 4, 32, 1}, Row{"zbv", 4, 32, 2}}) {
    Pipeline pipeline(sleep_model(8, 0), mse_config(r.p, r.m, r.v, r.schedule));
    Tensor x = zeros({r.m, 1}), y = zeros({r.m, 1});
    const double us = step_time_us(pipeline, x, y, 20);
    const double path = validate_schedule(make_schedule(r.schedule, r.p, r.m, r.v), r.p, r.m, r.v,
                                          placement_of(r.schedule), r.v, r.v)
                            .makespan;
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %d | %d | %d | %.1f | %.0f | %.2f |\n",
                  r.schedule.c_str(), r.p, r.m, r.v, us, path, us / path);
    out << row;
    std::fputs(row, stdout);
    std::fflush(stdout);
  }
  return out.str();
}

std::string memory_table() {
  std::ostringstream out;
  out << "\nPeak memory during one training step (allocator peak minus live bytes before the "
         "step), GPT vocab 65, context 128, 6 layers, width 128, batch 32, p = 4, m = 16 "
         "(interleaved and zbv: 2 chunks per stage)\n\n"
      << "| schedule | recompute | peak stashed per stage | peak deferred W per stage | peak "
         "step memory MiB |\n| --- | --- | --- | --- | --- |\n";
  std::vector<int64_t> tokens(32 * 128), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 7) % 65);
    targets[i] = static_cast<int64_t>((i * 7 + 3) % 65);
  }
  Tensor x = from_vector(tokens, {32, 128}), y = from_vector(targets, {32, 128});
  struct Row {
    std::string schedule, recompute;
    int max_deferred = 0;
  };
  for (const Row& r :
       {Row{"gpipe", "none"}, Row{"gpipe", "full"}, Row{"1f1b", "none"}, Row{"1f1b", "full"},
        Row{"interleaved", "none"}, Row{"interleaved", "full"}, Row{"zbh1", "none"},
        Row{"zbh1", "full"}, Row{"zbh2", "none"}, Row{"zbh2", "full"}, Row{"zbv", "none"},
        Row{"zbv", "full"}, Row{"zbv", "none", 2}, Row{"zbv", "full", 2}}) {
    Generator generator(0);
    PipelineConfig config = mse_config(4, 16, chunks_per_stage(r.schedule), r.schedule);
    config.loss = {{"type", "CrossEntropyLoss"}};
    config.recompute = r.recompute;
    config.max_deferred = r.max_deferred;
    Pipeline pipeline(gpt({65, 128, 6, 4, 128, 0.0}, &generator), config);
    pipeline.train_step(x, y);
    const size_t before = cpu_memory_stats().allocated;
    reset_cpu_peak_memory();
    pipeline.train_step(x, y);
    const double mib = static_cast<double>(cpu_memory_stats().peak_allocated - before) / (1 << 20);
    const StepStats& stats = pipeline.coordinator().last_step();
    char row[256];
    const std::string label =
        r.max_deferred > 0 ? r.schedule + " (max_deferred " + std::to_string(r.max_deferred) + ")"
                           : r.schedule;
    std::snprintf(row, sizeof row, "| %s | %s | %s | %s | %.1f |\n", label.c_str(),
                  r.recompute.c_str(), joined(stats.peak_stashed).c_str(),
                  joined(stats.peak_deferred).c_str(), mib);
    out << row;
    std::fputs(row, stdout);
    std::fflush(stdout);
  }
  return out.str();
}

// Step time of `model` under `config` with its 4 stages in threads, or in 4 fresh worker
// processes (each serves one run).
double step_time_us(const std::shared_ptr<Sequential>& model, const PipelineConfig& config,
                    bool processes, int m, int steps) {
  Tensor x = zeros({m, 1}), y = zeros({m, 1});
  if (!processes) {
    Pipeline pipeline(model, config);
    return step_time_us(pipeline, x, y, steps);
  }
  const support::Workers workers =
      support::start_workers(config.stages, {.flags = {"--runs", "1"}});
  Pipeline pipeline(model, config, Launch::workers(support::endpoints(workers)));
  return step_time_us(pipeline, x, y, steps);
}

// Threads against worker processes: efficiency with sleeping layers, and overhead per task
// with zero-cost ones, for the schedules torch's pipelining also has.
std::string processes_table(int64_t layer_us) {
  const int p = 4, layers = 8;
  std::ostringstream out;
  out << "\nStages in threads of one process and in 4 worker processes over TCP (loopback): "
         "efficiency with the sleeping layers above (median of 3 steps), and us per task "
         "with zero-cost layers at m = 32 (median of 20 steps)\n\n"
      << "| schedule | m | v | theoretical ms | threads ms (efficiency) | processes ms "
         "(efficiency) | threads us/task | processes us/task |\n"
      << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zbv"}) {
    const int v = chunks_per_stage(schedule);
    PipelineConfig zero = mse_config(p, 32, v, schedule);
    const double path =
        validate_schedule(make_schedule(schedule, p, 32, v), p, 32, v, placement_of(schedule), v, v)
            .makespan;
    const double threads_task = step_time_us(sleep_model(layers, 0), zero, false, 32, 20) / path;
    const double processes_task = step_time_us(sleep_model(layers, 0), zero, true, 32, 20) / path;
    for (int m : {8, 16, 32}) {
      PipelineConfig config = mse_config(p, m, v, schedule);
      config.layer_counts.assign(static_cast<size_t>(p * v), layers / (p * v));
      config.layer_counts[0] += 1;
      const double theory =
          theoretical_step_time(schedule, p, m, v, 2.0 * layer_us, 4.0 * layer_us);
      const double threads =
          step_time_us(sleep_model_with_free_head(layers, layer_us), config, false, m, 3);
      const double processes =
          step_time_us(sleep_model_with_free_head(layers, layer_us), config, true, m, 3);
      char row[320];
      std::snprintf(row, sizeof row,
                    "| %s | %d | %d | %.1f | %.1f (%.3f) | %.1f (%.3f) | %.2f | %.2f |\n",
                    schedule.c_str(), m, v, theory / 1000, threads / 1000, theory / threads,
                    processes / 1000, theory / processes, threads_task, processes_task);
      out << row;
      std::fputs(row, stdout);
      std::fflush(stdout);
    }
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (support::worker_role_requested(argc, argv)) return support::worker_role_main(argc, argv);
  support::Flags flags("pipeline_schedules",
                       "Every schedule's efficiency against theory, per-task overhead and memory, "
                       "with sleeping layers (in-process and as worker processes).");
  flags.add("layer-ms", "4", "a sleeping layer's forward time in ms (backward: twice that)");
  bench::add_no_append_flag(flags);
  flags.add("timeline", "", "print one step's timeline of this schedule instead");
  flags.add("timeline-m", "8", "microbatches of --timeline's step");
  flags.parse(argc, argv);
  const int64_t layer_us = static_cast<int64_t>(flags.number("layer-ms") * 1000);
  const bool append = !flags.on("no-append");
  const std::string timeline_schedule = flags.str("timeline");
  const int timeline_m = static_cast<int>(flags.integer("timeline-m"));
  set_num_threads(1);
  if (!timeline_schedule.empty()) {
    // Only the timeline of one step of the efficiency experiment, one column per layer cost.
    std::fputs(efficiency_timeline(layer_us, timeline_schedule, timeline_m).c_str(), stdout);
    return 0;
  }
  std::string tables = efficiency_table(layer_us);
  tables += overhead_table();
  tables += memory_table();
  tables += processes_table(layer_us);
  if (append) bench::append_results("pipeline_schedules", tables);
  return 0;
}
