// The parameter server, measured (ps/):
//  1. Throughput against the number of workers (1, 2, 4, 8): MLP 784-1024-1024-10, batch 64 per
//     worker, SGD; one server and the workers as processes over TCP (this program in its
//     server and worker roles), sync and async; beside it, in the same run, PyTorch
//     DistributedDataParallel (gloo) with as many worker processes (bench/ps_ddp.py), under
//     PyTorch 2.x from PyPI (the benchmarks' venv) and Debian's python3-torch, where installed.
//  2. A model of more cores: from the 1-worker run's measured compute, communication and
//     server times per step, the sync step time with W workers each on its own core.
//  3. Time to a target loss with one worker of 4 slowed 4x: sync, async and bounded, in
//     threads, an MLP on clustered data (as train_ps); the loss against wall-clock drawn as
//     an SVG (--svg, docs/ps_loss_vs_time.svg).
// Printed and appended to bench/RESULTS.md.
//   usage: ps [--steps 40] [--no-append]
// (ps --role server|worker ... are the processes it starts itself.)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "bench/ps_processes.h"
#include "bench/results.h"
#include "codec/atomic_file.h"
#include "nn/builders.h"
#include "pipit.h"
#include "ps/launch.h"
#include "ps/shard_plan.h"
#include "ps/tcp.h"
#include "support/child_process.h"
#include "support/flags.h"
#include "train/run_report.h"

using namespace pipit;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kWarmup = 5;
using bench::kBatch;
const std::vector<int64_t>& kDims = bench::kMlpDims;

PsConfig config_of(const std::string& mode, int workers) {
  PsConfig config;
  config.mode = mode;
  config.workers = workers;
  config.servers = 1;
  config.optimizer = {{"type", "SGD"}, {"lr", 0.01}};
  return config;
}

std::shared_ptr<Module> throughput_model() {
  Generator generator(0);
  return mlp(kDims, "relu", &generator);
}

// Worker `index`'s synthetic batch.
std::pair<Tensor, Tensor> batch_of(int index) {
  Generator generator(100 + static_cast<uint64_t>(index));
  const Tensor x = randn({kBatch, kDims.front()}, &generator);
  std::vector<int64_t> labels(kBatch);
  for (auto& label : labels) {
    label = static_cast<int64_t>(generator.bits(generator.reserve(1)) % 10);
  }
  return {x, from_vector(labels, {kBatch})};
}

// One server and `workers` worker processes of this program (bench/ps_processes.h).
bench::PsTimes measure_processes(const std::string& mode, int workers, int64_t steps,
                                 const fs::path& dir) {
  return bench::run_ps_processes(
      {fs::read_symlink("/proc/self/exe").string(), "--mode", mode, "--workers",
       std::to_string(workers), "--steps", std::to_string(steps)},
      1, workers, kBatch, dir);
}

// The same run in threads of this process (train_ps): no bytes are copied between
// workers and server but the parameter snapshot. Timed from the moment every worker is past
// its warm-up steps.
double measure_threads(const std::string& mode, int workers, int64_t steps) {
  set_num_threads(1);
  PsConfig config = config_of(mode, workers);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int w = 0; w < workers; ++w) batches.push_back(batch_of(w));
  PsRunOptions options;
  options.steps = kWarmup + steps;
  options.batch = [&](int w, int64_t) { return batches[static_cast<size_t>(w)]; };
  int warmed_up = 0;
  Clock::time_point start, end;
  options.on_step = [&](int, int64_t step, double) {
    if (step == kWarmup - 1 && ++warmed_up == workers) start = Clock::now();
    end = Clock::now();
  };
  train_ps(*throughput_model(), config, options);
  return static_cast<double>(workers * steps * kBatch) /
         std::chrono::duration<double>(end - start).count();
}

// bench/ps_ddp.py's samples/s under `python` (0 when its PyTorch is not there) and torch's
// version.
std::pair<double, std::string> measure_ddp(const std::string& python, int workers, int64_t steps) {
  const std::string command = python + " " + PIPIT_SOURCE_DIR + "/bench/ps_ddp.py --workers " +
                              std::to_string(workers) + " --dims 784,1024,1024,10 --batch " +
                              std::to_string(kBatch) + " --steps " + std::to_string(steps) +
                              " 2>/dev/null";
  const std::vector<json> rows = bench::peer_json_lines(command, "ps");
  if (rows.empty() || !rows.back().contains("samples_per_s")) return {0, "not installed"};
  return {rows.back()["samples_per_s"].get<double>(), rows.back().value("torch", "?")};
}

// Part 3: the clustered-data MLP of train_ps, 4 workers, worker 3 slowed 4x. The loss the
// run has reached: the mean of the last 80 worker losses (20 sync steps' worth).
const std::vector<double> kTargets = {1.0, 0.5, 0.2, 0.1};
constexpr size_t kWindow = 80;

struct TimeToLoss {
  std::vector<double> seconds = std::vector<double>(kTargets.size(), -1);  // per target
  std::vector<std::pair<double, double>> curve;  // (seconds, the last 80 losses' mean)
  double total_seconds = 0;
  int64_t updates = 0;
  int64_t max_staleness = 0;
};

TimeToLoss time_to_loss(const std::string& mode) {
  constexpr int64_t kFeatures = 32, kClasses = 8, kSamples = 8192, kSmallBatch = 32;
  Generator generator(1001);
  const Tensor centres = normal({kClasses, kFeatures}, 0.0, 1.0, &generator);
  std::vector<int64_t> labels(kSamples);
  for (auto& label : labels) {
    label = static_cast<int64_t>(generator.bits(generator.reserve(1)) % kClasses);
  }
  const Tensor y = from_vector(labels, {kSamples});
  const Tensor x = embedding(centres, y) + normal({kSamples, kFeatures}, 0.0, 1.0, &generator);
  Generator model_generator(1);
  auto model = mlp({kFeatures, 256, 256, kClasses}, "relu", &model_generator);

  PsConfig config;
  config.mode = mode;
  config.workers = 4;
  config.max_staleness = 3;
  // Every update averages 4 gradients in every mode, as sync's does: the modes differ in
  // waiting and staleness only, not in the step size per sample.
  config.accumulate = 4;
  config.optimizer = {{"type", "SGD"}, {"lr", 0.004}, {"momentum", 0.9}};
  PsRunOptions options;
  options.steps = 400;
  options.slowdown = {1, 1, 1, 4};
  options.batch = [&](int w, int64_t step) {
    const int64_t begin = ((step * 4 + w) * kSmallBatch) % (kSamples - kSmallBatch + 1);
    return std::make_pair(narrow(x, 0, begin, kSmallBatch).contiguous(),
                          narrow(y, 0, begin, kSmallBatch).contiguous());
  };
  TimeToLoss result;
  std::deque<double> recent;
  double sum = 0;
  int64_t calls = 0;
  const auto start = Clock::now();
  options.on_step = [&](int, int64_t, double loss) {
    recent.push_back(loss);
    sum += loss;
    if (recent.size() > kWindow) {
      sum -= recent.front();
      recent.pop_front();
    }
    if (recent.size() < kWindow) return;
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (++calls % 8 == 0 || result.curve.empty()) {
      result.curve.emplace_back(seconds, sum / kWindow);
    }
    for (size_t i = 0; i < kTargets.size(); ++i) {
      if (result.seconds[i] < 0 && sum / kWindow < kTargets[i]) result.seconds[i] = seconds;
    }
  };
  const PsRunReport report = train_ps(*model, config, options);
  result.total_seconds = report.seconds;
  result.updates = report.servers[0].version;
  result.max_staleness = report.servers[0].staleness.rbegin()->first;
  return result;
}

std::string format(const char* pattern, auto... values) {
  char text[512];
  std::snprintf(text, sizeof text, pattern, values...);
  return text;
}

int run(const support::Flags& flags) {
  const int64_t steps = flags.integer("steps", 10);
  const bool append = !flags.on("no-append");
  const fs::path dir = fs::temp_directory_path() / ("pipit_bench_ps_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ostringstream out;
  out << "Throughput, MLP 784-1024-1024-10, batch " << kBatch << " per worker, SGD, one thread "
      << "per process, " << steps << " timed steps after " << kWarmup
      << "; like for like first: pipit's server and workers as processes over TCP against "
         "torch's DistributedDataParallel workers as processes (gloo); pipit's roles as threads "
         "of one process after:\n\n"
      << "| workers | torch (PyPI) | its DDP samples/s | torch (Debian) | its DDP samples/s | "
         "pipit sync, TCP processes | sync TCP / the faster DDP | pipit async, TCP processes | "
         "pipit sync, threads | sync threads / the faster DDP | pipit async, threads | TCP sync: "
         "compute ms/step | push+pull ms/step | server ms/gradient |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::printf("%s", out.str().c_str());
  bench::PsTimes single;
  for (int workers : {1, 2, 4, 8}) {
    // PyTorch 2.x from PyPI (the benchmarks' venv) and Debian's, each where installed.
    const auto [pypi, pypi_torch] = bench::peer_python() == "/usr/bin/python3"
                                        ? std::pair<double, std::string>{0, "not installed"}
                                        : measure_ddp(bench::peer_python(), workers, steps);
    const auto [debian, debian_torch] = measure_ddp("/usr/bin/python3", workers, steps);
    const double ddp = std::max(pypi, debian);
    const bench::PsTimes sync = measure_processes("sync", workers, steps, dir);
    const bench::PsTimes async = measure_processes("async", workers, steps, dir);
    const double sync_threads = measure_threads("sync", workers, steps);
    const double async_threads = measure_threads("async", workers, steps);
    if (workers == 1) single = sync;
    auto ratio = [&](double pipit) { return ddp > 0 ? format("%.2f", pipit / ddp) : "-"; };
    auto measured = [](double samples) { return samples > 0 ? format("%.0f", samples) : "-"; };
    const std::string row = format(
        "| %d | %s | %s | %s | %s | %.0f | %s | %.0f | %.0f | %s | %.0f | %.2f | %.2f | %.2f |\n",
        workers, pypi_torch.c_str(), measured(pypi).c_str(), debian_torch.c_str(),
        measured(debian).c_str(), sync.samples_per_s, ratio(sync.samples_per_s).c_str(),
        async.samples_per_s, sync_threads, ratio(sync_threads).c_str(), async_threads,
        sync.compute_ms, sync.wait_ms, sync.server_ms_per_gradient);
    std::printf("%s", row.c_str());
    std::fflush(stdout);
    out << row;
  }
  // Each worker on its own core and the server on another: a sync step is the compute, the
  // communication (push and pull, measured with one worker, less the server's own time) and
  // the server's work for every gradient, which it does one after another.
  const double comm = std::max(0.0, single.wait_ms - single.server_ms_per_gradient);
  out << "\nModel of more cores, from the 1-worker sync run (compute "
      << format("%.2f", single.compute_ms) << " ms, communication " << format("%.2f", comm)
      << " ms, server " << format("%.2f", single.server_ms_per_gradient)
      << " ms per gradient): sync step = compute + communication + workers x server time.\n\n"
      << "| workers | predicted step ms | predicted samples/s | speed-up over 1 "
         "|\n|---|---|---|---|\n";
  const double one = single.compute_ms + comm + single.server_ms_per_gradient;
  for (int workers : {1, 2, 4, 8, 16}) {
    const double step = single.compute_ms + comm + workers * single.server_ms_per_gradient;
    out << format("| %d | %.2f | %.0f | %.2f |\n", workers, step, workers * kBatch * 1000.0 / step,
                  workers * one / step);
  }
  out << "\nTime to a loss (the mean of the last 80 worker losses below it), MLP 32-256-256-8 "
         "on clustered data, 4 workers in threads, worker 3 slowed 4x, 400 steps each, SGD "
         "lr 0.004 momentum 0.9, every update the mean of 4 gradients (async and bounded: "
         "accumulate 4); seconds from the start (drawn in docs/ps_loss_vs_time.svg):\n\n"
         "| mode | loss < 1 | < 0.5 | < 0.2 | < 0.1 | run seconds | updates | largest "
         "staleness (versions) |\n|---|---|---|---|---|---|---|---|\n";
  std::map<std::string, TimeToLoss> reached;
  for (const std::string mode : {"sync", "async", "bounded"}) {
    const TimeToLoss t = time_to_loss(mode);
    reached[mode] = t;
    out << "| " << (mode == "bounded" ? "bounded (max_staleness 3)" : mode) << " | ";
    for (double seconds : t.seconds) {
      out << (seconds < 0 ? std::string("not reached") : format("%.2f", seconds)) << " | ";
    }
    out << format("%.2f | %lld | %lld |\n", t.total_seconds, static_cast<long long>(t.updates),
                  static_cast<long long>(t.max_staleness));
  }
  std::vector<ChartSeries> curves;
  for (const auto& [mode, colour] : {std::pair{"sync", "#1f77b4"}, std::pair{"async", "#d62728"},
                                     std::pair{"bounded", "#2ca02c"}}) {
    curves.push_back({mode, colour, reached[mode].curve});
  }
  write_file_atomic(flags.str("svg"),
                    line_chart_svg("Mean loss of the last 80 worker steps, 4 workers, worker 3 "
                                   "slowed 4x",
                                   "seconds", curves));
  out << "\nSync's time over async's and bounded's, per loss:";
  for (size_t i = 0; i < kTargets.size(); ++i) {
    const double sync = reached["sync"].seconds[i], async = reached["async"].seconds[i],
                 bounded = reached["bounded"].seconds[i];
    if (sync > 0 && async > 0 && bounded > 0) {
      out << format(" %.2f: %.2fx, %.2fx;", kTargets[i], sync / async, sync / bounded);
    }
  }
  out << "\n";
  std::printf("%s", out.str().substr(out.str().find("\nModel")).c_str());
  fs::remove_all(dir);
  if (append) {
    bench::append_results("ps", "`build/ps --steps " + std::to_string(steps) + "`. " + out.str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("ps", "The parameter server's modes against PyTorch DDP, like for like.");
  flags.add("steps", "40", "training steps per row (>= 10)");
  flags.add_switch("no-append", "print only; do not append to bench/RESULTS.md");
  flags.add("svg", std::string(PIPIT_SOURCE_DIR) + "/docs/ps_loss_vs_time.svg",
            "where to draw the loss against wall-clock of sync, async and bounded");
  bench::add_ps_role_flags(flags);
  flags.add("mode", "sync", "internal, with --role: sync or async");
  flags.add("workers", "1", "internal, with --role: the run's workers");
  flags.parse(argc, argv);
  const std::string role = flags.choice("role", {"", "server", "worker"});
  try {
    if (role.empty()) return run(flags);
    set_num_threads(1);
    const PsConfig config =
        config_of(flags.str("mode"), static_cast<int>(flags.integer("workers")));
    if (role == "server") return bench::ps_server_role(flags, config, *throughput_model());
    const auto [x, y] = batch_of(static_cast<int>(flags.integer("index", 0)));
    return bench::ps_worker_role(flags, config, throughput_model(), x, y, kWarmup);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps: %s\n", e.what());
    return 1;
  }
}
