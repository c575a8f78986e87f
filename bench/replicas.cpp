// Pipelines times data parallelism (PipelineConfig::replicas): the step time of p stages x r
// replicas on r times the data against p stages alone, printed and appended to
// bench/RESULTS.md. Layers sleep (support/sleep_layer.h) so that a 2-core machine can time
// many stages without them fighting for cores; Ballast layers (support/ballast_layer.h) add weights
// that cost nothing to compute but whose gradients every replica group must sum, so the rows show
// what the sum costs per megabyte. Scaling efficiency = t(p, 1) / t(p, r): 1.0 trains r times
// the data in the same time. Then the r-only case against PyTorch's DistributedDataParallel
// (gloo) on a real MLP, both as 2 processes of this machine (bench/ps_ddp.py is the peer), and
// p x r over TCP against torch.distributed.pipelining with DDP-wrapped stages
// (bench/replicas_torch.py); ZeRO-1's rows; and build/train_gpt's GPT at r = 1 and 2 in
// threads, over TCP workers and under mpirun. The sleeping rows run under mpirun too (this
// binary as the ranks, --mpi-row), with r = 2's pairs summed by MPI_Iallreduce and, to compare,
// by the chain over MPI messages.
//   replicas [--layer-ms 2] [--steps 5] [--no-append]
// (replicas --worker FLAGS is the worker role, started by the benchmark itself.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <sstream>

#include "bench/results.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "support/ballast_layer.h"
#include "support/flags.h"
#include "support/sleep_layer.h"
#include "support/worker_process.h"
#ifdef PIPIT_WITH_MPI
#endif

using namespace pipit;

namespace {

using Clock = std::chrono::steady_clock;

// Per stage: 4 sleeping layers and, with `ballast_mb`, that many MB of weights in 4 tensors
// (a sharded optimizer shares whole tensors out over the replicas).
std::shared_ptr<Sequential> model_of(int stages, int64_t layer_us, double ballast_mb) {
  auto model = std::make_shared<Sequential>();
  for (int s = 0; s < stages; ++s) {
    for (int i = 0; i < 4; ++i) {
      model->push_back(std::make_shared<support::SleepLayer>(layer_us));
      if (ballast_mb > 0) {
        model->push_back(
            std::make_shared<support::Ballast>(static_cast<int64_t>(ballast_mb * 1e6 / 16)));
      }
    }
  }
  return model;
}

// --layer-ms in microseconds.
int64_t layer_us_of(const support::Flags& flags) {
  return std::llround(flags.number("layer-ms") * 1000);
}

struct Timing {
  double step_ms = 0;
  double sum_ms = 0;    // the longest time a stage's sum went on past its last task (trace), median
  double state_mb = 0;  // threads: the most optimizer state one stage thread holds
};

// How the rows train: SGD without momentum (no optimizer state), or AdamW with its state
// whole on every replica or sharded over them (ZeRO-1).
enum class Update { sgd, adamw, adamw_sharded };

template <typename AnyPipeline>
Timing median_step_ms(AnyPipeline& pipeline, const Tensor& x, const Tensor& y, int steps) {
  pipeline.train_step(x, y);  // warm-up
  std::vector<double> times, sums;
  for (int i = 0; i < steps; ++i) {
    pipeline.coordinator().clear_trace();
    const auto start = Clock::now();
    pipeline.train_step(x, y);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    // Per stage: its last task's end, and when its sums were in place.
    std::map<int, double> last_task_end, sum_end;
    for (const TraceEvent& e : pipeline.coordinator().trace().events()) {
      auto& end = e.task.phase == Phase::GradientSum ? sum_end : last_task_end;
      end[e.task.stage] = std::max(end[e.task.stage], e.end_us);
    }
    double longest = 0;
    for (const auto& [stage, end] : sum_end) {
      longest = std::max(longest, (end - last_task_end[stage]) / 1000);
    }
    sums.push_back(longest);
  }
  return {bench::median(times), bench::median(sums)};
}

PipelineConfig config_of(int p, int r, double ballast_mb, Update update) {
  PipelineConfig config;
  config.stages = p;
  config.replicas = r;
  config.microbatches = 4;
  config.loss = {{"type", "MSELoss"}};
  config.optimizer = update == Update::sgd
                         ? nlohmann::json{{"type", "SGD"}, {"lr", 0.0}}
                         : nlohmann::json{{"type", "AdamW"}, {"lr", 0.0}, {"weight_decay", 0.0}};
  config.shard_optimizer = update == Update::adamw_sharded;
  config.layer_counts.assign(static_cast<size_t>(p), ballast_mb > 0 ? 8 : 4);
  config.trace = true;
  return config;
}

// Where a row's stages run.
enum class Where { threads, tcp, mpi_pairs, mpi_chain };

const char* where_name(Where where) {
  // In Where's order.
  static constexpr const char* kNames[] = {"threads", "worker processes (TCP)",
                                           "mpirun ranks (MPI_Iallreduce pairs)",
                                           "mpirun ranks (chain over MPI messages)"};
  static_assert(std::size(kNames) == static_cast<size_t>(Where::mpi_chain) + 1);
  return kNames[static_cast<size_t>(where)];
}

#ifdef PIPIT_WITH_MPI
// One rank of an mpirun job that this binary started (mpi_step_ms) with --mpi-row and the row's
// flags: rank 0 prints the row's timing as a JSON line.
int mpi_row(const support::Flags& flags) {
  const int p = static_cast<int>(flags.integer("stages"));
  const int r = static_cast<int>(flags.integer("replicas"));
  const int steps = static_cast<int>(flags.integer("steps"));
  const double ballast_mb = flags.number("ballast-mb");
  MpiOptions options;
  options.pair_replicas = flags.on("pair-sums");
  const auto model = model_of(p, layer_us_of(flags), ballast_mb);
  Pipeline pipeline(model, config_of(p, r, ballast_mb, Update::sgd), Launch::mpi(options));
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    return 0;
  }
  const Tensor x = zeros({8 * r, 1}), y = zeros({8 * r, 1});
  const Timing t = median_step_ms(pipeline, x, y, steps);
  std::printf("{\"step_ms\": %.3f, \"sum_ms\": %.3f, \"pair_sums\": %lld}\n", t.step_ms, t.sum_ms,
              static_cast<long long>(pipeline.pair_sums()));
  return 0;
}

Timing mpi_step_ms(int p, int r, int64_t layer_us, double ballast_mb, bool pairs, int steps) {
  namespace fs = std::filesystem;
  const fs::path bin = fs::read_symlink("/proc/self/exe");
  const std::string command =
      "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(p * r) + " " +
      bin.string() + " --mpi-row --stages " + std::to_string(p) + " --replicas " +
      std::to_string(r) + " --ballast-mb " + std::to_string(ballast_mb) + " --steps " +
      std::to_string(steps) + " --layer-ms " + std::to_string(layer_us / 1000.0) +
      (pairs ? " --pair-sums" : "") + " 2>/dev/null";
  const std::vector<nlohmann::json> rows = bench::peer_json_lines(command, "replicas");
  if (rows.empty() || !rows.back().contains("step_ms")) return {};
  if (pairs && r == 2 && rows.back()["pair_sums"].get<int64_t>() == 0) {
    std::fprintf(stderr, "replicas: rank 0 ran no pair sum with r = 2\n");
  }
  return {rows.back()["step_ms"].get<double>(), rows.back()["sum_ms"].get<double>()};
}
#endif

// p stages x r replicas, m = 4 microbatches each, on r * 8 rows.
Timing step_ms(int p, int r, int64_t layer_us, double ballast_mb, Where where, int steps,
               Update update = Update::sgd) {
#ifdef PIPIT_WITH_MPI
  if (where == Where::mpi_pairs || where == Where::mpi_chain) {
    return mpi_step_ms(p, r, layer_us, ballast_mb, where == Where::mpi_pairs, steps);
  }
#endif
  const PipelineConfig config = config_of(p, r, ballast_mb, update);
  const auto model = model_of(p, layer_us, ballast_mb);
  const Tensor x = zeros({8 * r, 1}), y = zeros({8 * r, 1});
  if (where == Where::threads) {
    Pipeline pipeline(model, config);
    Timing timing = median_step_ms(pipeline, x, y, steps);
    for (int e = 0; e < p * r; ++e) {
      double bytes = 0;
      for (const auto& [name, value] : pipeline.stage(e).optimizer().state_dict()) {
        bytes += static_cast<double>(value.nbytes());
      }
      timing.state_mb = std::max(timing.state_mb, bytes / 1e6);
    }
    return timing;
  }
  const support::Workers workers = support::start_workers(p * r, {.flags = {"--runs", "1"}});
  Pipeline pipeline(model, config, Launch::workers(support::endpoints(workers)));
  return median_step_ms(pipeline, x, y, steps);
}

// The MLP bench/ps.cpp trains (784-1024-1024-10, ReLU, cross-entropy, SGD 0.01), 64 rows
// per replica, as 1 stage x 2 replicas in 2 worker processes: samples per second.
double pipit_mlp_samples_per_s(int steps) {
  constexpr int64_t kBatch = 64;
  Generator generator(7);
  auto model = mlp({784, 1024, 1024, 10}, "relu", &generator);
  PipelineConfig config;
  config.stages = 1;
  config.replicas = 2;
  config.microbatches = 1;
  config.optimizer = {{"type", "SGD"}, {"lr", 0.01}};
  const Tensor x = randn({2 * kBatch, 784}, &generator);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 2 * kBatch; ++i) labels.push_back(i % 10);
  const Tensor y = from_vector(labels, {2 * kBatch});
  const support::Workers workers =
      support::start_workers(2, {.pipit_worker = true, .flags = {"--runs", "1"}});
  Pipeline pipeline(model, config, Launch::workers(support::endpoints(workers)));
  const Timing t = median_step_ms(pipeline, x, y, steps);
  return 2 * kBatch / (t.step_ms / 1000);
}

// build/train_gpt's tokens per second (its last printed window) for 2 stages x r replicas on
// r x 16 sequences per step, in stage threads, over pipit-workers (TCP) or under mpirun.
double train_gpt_tokens_per_s(const std::string& where, int r, int steps) {
  namespace fs = std::filesystem;
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  std::string command = (bin / "train_gpt").string() + " --stages 2 --replicas " +
                        std::to_string(r) + " --batch " + std::to_string(16 * r) + " --steps " +
                        std::to_string(steps) + " --print-every 10";
  support::Workers workers;
  if (where == "tcp") {
    workers = support::start_workers(2 * r, {.pipit_worker = true, .flags = {"--runs", "1"}});
    std::string list;
    for (const std::string& endpoint : support::endpoints(workers)) {
      list += (list.empty() ? "" : ",") + endpoint;
    }
    command += " --workers " + list;
  } else if (where == "mpi") {
    command = "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(2 * r) + " " +
              command + " --launcher mpi";
  }
  const bench::CommandOutput run = bench::command_output(command + " 2>/dev/null");
  double tokens_per_s = 0;
  for (const std::string& line : run.lines) {
    double value = 0;
    if (const size_t at = line.find("tokens/s");
        at != std::string::npos && std::sscanf(line.c_str() + at + 8, "%lf", &value)) {
      tokens_per_s = value;
    }
  }
  if (!run.ok) std::fprintf(stderr, "replicas: '%s' failed\n", command.c_str());
  return tokens_per_s;
}

// A finished table: printed now and kept for bench/RESULTS.md.
void publish(std::ostringstream& results, const std::ostringstream& section) {
  std::fputs(section.str().c_str(), stdout);
  std::fflush(stdout);
  results << section.str();
}

// The sleeping rows: p = 2 stages x r replicas in threads, over TCP and under mpirun; the TCP
// rows' step times go to `over_tcp` ((ballast MB, r) -> ms), for the table against PyTorch.
void sleeping_rows(std::ostringstream& results, const std::string& layer_ms, int64_t layer_us,
                   int steps, std::map<std::pair<double, int>, double>& over_tcp) {
  std::ostringstream table;
  table << "p = 2 stages of 4 sleeping layers (" << layer_ms
        << " ms forward, twice that backward), m = 4 microbatches per replica, 1F1B; ballast: "
           "weights per stage that cost nothing to compute but are summed over the replicas. "
           "Median of "
        << steps
        << " steps. Efficiency = t(p, r = 1) / t(p, r) on r times the data (1.0: perfect "
           "scaling); added = t(p, r) - t(p, 1): the gradient sums, and on a machine with few "
           "cores the ballast's compute, which the replicas' stages share; exposed sum = in the "
           "step's trace, the longest time a stage's gradient sum went on after the stage's "
           "last task (the sum starts layer by layer during that task).\n\n"
        << "| where | ballast MB per stage | r | step ms | efficiency | added ms | exposed sum ms "
           "|\n"
        << "| --- | --- | --- | --- | --- | --- | --- |\n";
  std::fputs(table.str().c_str(), stdout);
  std::vector<Where> wheres{Where::threads, Where::tcp};
#ifdef PIPIT_WITH_MPI
  wheres.insert(wheres.end(), {Where::mpi_pairs, Where::mpi_chain});
#endif
  for (const Where where : wheres) {
    for (const double ballast_mb : {0.0, 16.0}) {
      const Timing alone = step_ms(2, 1, layer_us, ballast_mb, where, steps);
      const std::vector<int> rs = where == Where::threads     ? std::vector<int>{1, 2, 4}
                                  : where == Where::mpi_chain ? std::vector<int>{2, 3}
                                                              : std::vector<int>{1, 2};
      for (const int r : rs) {
        const Timing t = r == 1 ? alone : step_ms(2, r, layer_us, ballast_mb, where, steps);
        if (where == Where::tcp) over_tcp[{ballast_mb, r}] = t.step_ms;
        char row[256];
        std::snprintf(row, sizeof row, "| %s | %.0f | %d | %.1f | %.3f | %.1f | %.1f |\n",
                      where_name(where), ballast_mb, r, t.step_ms, alone.step_ms / t.step_ms,
                      t.step_ms - alone.step_ms, t.sum_ms);
        table << row;
        std::fputs(row, stdout);
        std::fflush(stdout);
      }
    }
  }
  results << table.str();
}

// The TCP rows beside torch.distributed.pipelining with DDP-wrapped stages.
std::ostringstream against_torch_pipelining(
    const std::map<std::pair<double, int>, double>& over_tcp, const std::string& layer_ms,
    int steps) {
  std::ostringstream pipelined;
  pipelined << "\np x r against PyTorch: the rows above over TCP side by side with "
               "torch.distributed.pipelining (1F1B) whose stages are wrapped in "
               "DistributedDataParallel, p * r gloo processes on this machine, the same sleeping "
               "layers and ballast (bench/replicas_torch.py; DDP all-reduces in buckets during "
               "the backward)\n\n"
            << "| ballast MB per stage | r | pipit step ms | torch step ms | torch | pipit / "
               "torch speed |\n"
            << "| --- | --- | --- | --- | --- | --- |\n";
  for (const auto& [key, pipit_ms] : over_tcp) {
    const auto& [ballast_mb, r] = key;
    char command[512];
    std::snprintf(command, sizeof command,
                  "%s %s/bench/replicas_torch.py --replicas %d --ballast-mb %g --layer-ms %s "
                  "--steps %d 2>/dev/null",
                  bench::peer_python().c_str(), PIPIT_SOURCE_DIR, r, ballast_mb, layer_ms.c_str(),
                  steps);
    const std::vector<nlohmann::json> torch = bench::peer_json_lines(command, "replicas");
    char row[256];
    if (!torch.empty() && torch.back().contains("step_ms")) {
      const double torch_ms = torch.back()["step_ms"].get<double>();
      std::snprintf(row, sizeof row, "| %.0f | %d | %.1f | %.1f | %s | %.2f |\n", ballast_mb, r,
                    pipit_ms, torch_ms, torch.back().value("torch", std::string("?")).c_str(),
                    torch_ms / pipit_ms);
    } else {
      std::snprintf(row, sizeof row, "| %.0f | %d | %.1f | (PyTorch 2.x not found) | - | - |\n",
                    ballast_mb, r, pipit_ms);
    }
    pipelined << row;
  }
  return pipelined;
}

// ZeRO-1: AdamW's state whole on every replica against sharded over them.
std::ostringstream zero_rows(int64_t layer_us, int steps) {
  std::ostringstream zero;
  zero << "\nZeRO-1 (PipelineConfig::shard_optimizer): the same p = 2, r = 2 and 16 MB of ballast "
          "per stage (4 tensors) trained with AdamW; its state (2 x the weights) whole on every "
          "replica, or sharded: each replica keeps half and updates half, then the replicas "
          "exchange the updated weights. State MB: the most one stage of one replica holds "
          "(threads).\n\n"
       << "| where | optimizer | step ms | state MB per stage |\n"
       << "| --- | --- | --- | --- |\n";
  for (const bool processes : {false, true}) {
    for (const Update update : {Update::adamw, Update::adamw_sharded}) {
      const Timing t =
          step_ms(2, 2, layer_us, 16.0, processes ? Where::tcp : Where::threads, steps, update);
      char row[256];
      std::snprintf(row, sizeof row, "| %s | %s | %.1f | %s |\n",
                    processes ? "worker processes (TCP)" : "threads",
                    update == Update::adamw ? "AdamW, whole" : "AdamW, sharded (ZeRO-1)", t.step_ms,
                    processes ? "-" : std::to_string(static_cast<int>(t.state_mb + 0.5)).c_str());
      zero << row;
    }
  }
  return zero;
}

// build/train_gpt's GPT at r = 1 and 2 in threads, over TCP workers and under mpirun.
std::ostringstream gpt_rows() {
  std::ostringstream gpt;
  gpt << "\nA real GPT: build/train_gpt's default model (4 layers, width 128, about 0.8M "
         "parameters), 2 stages x r replicas, 4 microbatches of 4 sequences per replica, "
         "tokens/s over steps 21-30. Every stage computes here, so with r = 2 four stages "
         "share this machine's 2 cores: efficiency = tokens/s(r) / (r x tokens/s(1)) shows the "
         "cores running out more than the gradient sum.\n\n"
      << "| where | r | tokens/s | efficiency |\n"
      << "| --- | --- | --- | --- |\n";
  for (const std::string where : {"threads", "tcp", "mpi"}) {
    const double alone = train_gpt_tokens_per_s(where, 1, 30);
    for (const int r : {1, 2}) {
      const double t = r == 1 ? alone : train_gpt_tokens_per_s(where, r, 30);
      char row[256];
      std::snprintf(row, sizeof row, "| %s | %d | %.0f | %.2f |\n",
                    where == "threads" ? "stage threads"
                    : where == "tcp"   ? "pipit-workers (TCP)"
                                       : "mpirun ranks (--launcher mpi)",
                    r, t, alone > 0 ? t / (r * alone) : 0.0);
      gpt << row;
    }
  }
  return gpt;
}

// r only: pipit's replicas against PyTorch DDP on a real MLP.
std::ostringstream against_ddp() {
  const double pipit_mlp = pipit_mlp_samples_per_s(20);
  const std::vector<nlohmann::json> ddp = bench::peer_json_lines(
      bench::peer_python() + " " + PIPIT_SOURCE_DIR +
          "/bench/ps_ddp.py --workers 2 --dims 784,1024,1024,10 --batch 64 --steps 20 "
          "2>/dev/null",
      "replicas");
  std::ostringstream peers;
  peers << "\nr only, against PyTorch: MLP 784-1024-1024-10, SGD, 64 rows per replica, 2 "
           "processes with 1 thread each on this machine (pipit: 1 stage x 2 replicas as "
           "pipit-workers over TCP, plus its coordinator; torch: DistributedDataParallel over "
           "gloo, bench/ps_ddp.py)\n\n"
        << "| pipit samples/s | torch DDP samples/s | torch | pipit / torch |\n"
        << "| --- | --- | --- | --- |\n";
  char row[256];
  if (!ddp.empty() && ddp.back().contains("samples_per_s")) {
    const double torch = ddp.back()["samples_per_s"].get<double>();
    std::snprintf(row, sizeof row, "| %.0f | %.0f | %s | %.2f |\n", pipit_mlp, torch,
                  ddp.back().value("torch", std::string("?")).c_str(), pipit_mlp / torch);
  } else {
    std::snprintf(row, sizeof row, "| %.0f | (PyTorch not found) | - | - |\n", pipit_mlp);
  }
  peers << row;
  return peers;
}

}  // namespace

int main(int argc, char** argv) {
  support::register_ballast_layer();
  if (support::worker_role_requested(argc, argv)) return support::worker_role_main(argc, argv);
  support::Flags flags("replicas",
                       "p stages x r replicas on r times the data against p stages alone.");
  flags.add("layer-ms", "2", "a sleeping layer's forward time in ms (backward: twice that)");
  flags.add("steps", "5", "timed steps per row (the median is kept)");
  bench::add_no_append_flag(flags);
  flags.add_switch("mpi-row",
                   "internal: be a rank of the mpirun job of one sleeping row (rank 0 prints it)");
  flags.add("stages", "2", "internal, with --mpi-row: the row's stages");
  flags.add("replicas", "1", "internal, with --mpi-row: the row's replicas");
  flags.add("ballast-mb", "0", "internal, with --mpi-row: the row's ballast per stage");
  flags.add_switch("pair-sums", "internal, with --mpi-row: sum pairs with MPI_Iallreduce");
  flags.parse(argc, argv);
  const int64_t layer_us = layer_us_of(flags);
  const int steps = static_cast<int>(flags.integer("steps"));
  set_num_threads(1);
  support::register_sleep_layer();
  if (flags.on("mpi-row")) {
#ifdef PIPIT_WITH_MPI
    return mpi_row(flags);
#else
    flags.fail("--mpi-row: this pipit was built without MPI");
#endif
  }
  std::ostringstream results;
  std::map<std::pair<double, int>, double> over_tcp;
  sleeping_rows(results, flags.str("layer-ms"), layer_us, steps, over_tcp);
  publish(results, against_torch_pipelining(over_tcp, flags.str("layer-ms"), steps));
  publish(results, zero_rows(layer_us, steps));
  publish(results, gpt_rows());
  publish(results, against_ddp());
  if (!flags.on("no-append")) bench::append_results("replicas", results.str());
  return 0;
}
