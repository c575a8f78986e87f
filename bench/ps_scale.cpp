// The parameter server at scale: k shards against 1 to 16 workers, sync and async, as
// processes over TCP and as mpirun ranks, each row beside its cost model's bound.
// Compute is emulated so that 2 cores can host 16 workers: each of the MLP 784-1024-1024-10's
// three layers is a sleeping layer (support/sleep_layer.h) beside Ballast of that layer's
// weights (support/ballast_layer.h), so every step's gradients are the MLP's 7.45 MB and cross
// the wire for real. Two compute-to-communication ratios:
//   communication-heavy: the sleep is the real MLP's forward and backward at batch 64 on one
//     thread, measured in this run;
//   compute-heavy: three times what the 16-worker step's bytes (16 pushes and 16 pulls) take
//     at the loopback bandwidth measured in this run (raw sockets, bench/raw_sockets.h).
// Efficiency: samples/s over (workers x the same k's one-worker samples/s).
// The bound of a row, in step time: max(compute, the step's bytes over the loopback, the
// busiest shard's work per step) plus the fixed cost no overlap hides: one worker's pull of the
// parameters at loopback speed and a round trip. Printed and appended to bench/RESULTS.md.
//   usage: ps_scale [--steps 12] [--cases comm,compute] [--transports tcp,mpi] [--no-append]
// (ps_scale --role server|worker|rank ... are the processes it starts itself.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/ps_processes.h"
#include "bench/raw_sockets.h"
#include "bench/results.h"
#include "codec/atomic_file.h"
#include "nn/builders.h"
#include "pipit.h"
#include "ps/launch.h"
#include "ps/shard_plan.h"
#include "ps/tcp.h"
#include "support/ballast_layer.h"
#include "support/child_process.h"
#include "support/flags.h"
#include "support/sleep_layer.h"

using namespace pipit;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kWarmup = 3;
using bench::kBatch;
const std::vector<int64_t>& kDims = bench::kMlpDims;

// The MLP's bytes with a sleeping layer per linear layer: forward `layer_us`, backward twice.
// Shards hold whole tensors, so each layer's weights and bias come as 4 tensors, enough for
// 8 shards to share them out evenly.
std::shared_ptr<Sequential> emulated_mlp(int64_t layer_us) {
  constexpr int64_t kPieces = 4;
  auto model = std::make_shared<Sequential>();
  for (size_t i = 0; i + 1 < kDims.size(); ++i) {
    model->push_back(std::make_shared<support::SleepLayer>(layer_us));
    const int64_t size = kDims[i] * kDims[i + 1] + kDims[i + 1];
    for (int64_t piece = 0; piece < kPieces; ++piece) {
      const int64_t begin = size * piece / kPieces, end = size * (piece + 1) / kPieces;
      model->push_back(std::make_shared<support::Ballast>(end - begin));
    }
  }
  return model;
}

int64_t model_bytes() {
  int64_t bytes = 0;
  for (const auto& [name, p] : emulated_mlp(0)->named_parameters()) {
    bytes += static_cast<int64_t>(p.nbytes());
  }
  return bytes;
}

PsConfig config_of(const std::string& mode, int shards, int workers) {
  PsConfig config;
  config.mode = mode;
  config.servers = shards;
  config.workers = workers;
  config.optimizer = {{"type", "SGD"}, {"lr", 0.01}};
  config.loss = {{"type", "MSELoss"}};
  config.timeout = std::chrono::milliseconds(120000);
  return config;
}

PsConfig config_of(const support::Flags& flags) {
  return config_of(flags.str("mode"), static_cast<int>(flags.integer("k")),
                   static_cast<int>(flags.integer("w")));
}

// One rank of `mpirun -np k+w`: train_ps over PsLaunch::mpi, the same model and steps.
int rank_role(const support::Flags& flags) {
  const PsConfig config = config_of(flags);
  const int64_t steps = flags.integer("steps");
  const Tensor x = ones({kBatch, 1}), y = zeros({kBatch, 1});
  PsRunOptions options;
  options.steps = kWarmup + steps;
  options.batch = [&](int, int64_t) { return std::make_pair(x, y); };
  double start = 0, end = 0;
  options.on_step = [&](int, int64_t step, double) {
    if (step == kWarmup - 1) start = bench::steady_seconds();
    end = bench::steady_seconds();
  };
  const PsRunReport report =
      train_ps(*emulated_mlp(flags.integer("layer-us", 0)), config, options, PsLaunch::mpi());
  const fs::path out = flags.str("out");
  for (size_t w = 0; w < report.losses.size(); ++w) {
    if (report.losses[w].empty()) continue;
    // Per step over every step, the warm-up's included: train_ps reports totals.
    const PsWorkerStats& stats = report.workers[w];
    const auto per_step = [&](double total) {
      return total / static_cast<double>(kWarmup + steps);
    };
    const json times = bench::ps_worker_times(start, end, steps, per_step(stats.compute_ms),
                                              per_step(stats.wait_ms));
    write_file_atomic((out / ("worker" + std::to_string(w) + ".json")).string(), times.dump());
  }
  for (size_t s = 0; s < report.servers.size(); ++s) {
    const PsServerStats& stats = report.servers[s];
    if (stats.gradients == 0) continue;
    write_file_atomic((out / ("server" + std::to_string(s) + ".json")).string(),
                      bench::ps_server_times(stats).dump());
  }
  return 0;
}

struct RowSpec {
  std::string mode, transport;
  int shards = 1, workers = 1;
  int64_t layer_us = 0, steps = 0;
};

// This program with the row's flags, to which a role's are added.
std::vector<std::string> row_argv(const RowSpec& r) {
  return {fs::read_symlink("/proc/self/exe").string(),
          "--mode",
          r.mode,
          "--k",
          std::to_string(r.shards),
          "--w",
          std::to_string(r.workers),
          "--layer-us",
          std::to_string(r.layer_us),
          "--steps",
          std::to_string(r.steps)};
}

// The row's times, or nothing when a role failed (said on stderr).
std::optional<bench::PsTimes> measure(const RowSpec& r, const fs::path& dir) {
  try {
    if (r.transport == "tcp")
      return bench::run_ps_processes(row_argv(r), r.shards, r.workers, kBatch, dir);
    std::string command =
        "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(r.shards + r.workers);
    for (const std::string& arg : row_argv(r)) command += " " + arg;
    command +=
        " --role rank --out " + dir.string() + " > " + (dir / "mpirun.log").string() + " 2>&1";
    PIPIT_CHECK(std::system(command.c_str()) == 0,
                "mpirun failed: ", read_file((dir / "mpirun.log").string()));
    return bench::read_ps_times(dir, r.shards, r.workers, kBatch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_scale: %s %s k = %d, %d workers: %s\n", r.transport.c_str(),
                 r.mode.c_str(), r.shards, r.workers, e.what());
    return std::nullopt;
  }
}

std::string format(const char* pattern, auto... values) {
  char text[512];
  std::snprintf(text, sizeof text, pattern, values...);
  return text;
}

struct Machine {
  double bytes_per_ms = 0;    // loopback, raw sockets
  double round_trip_ms = 0;   // 64 bytes, raw sockets
  double mlp_compute_ms = 0;  // the real MLP's forward and backward, batch 64, one thread
};

Machine measure_machine() {
  Machine m;
  const auto bytes = static_cast<size_t>(model_bytes());
  m.bytes_per_ms = bench::raw_throughput(bytes, 40) / 1000.0;
  m.round_trip_ms = bench::raw_round_trip_us(2000) / 1000.0;
  set_num_threads(1);
  Generator generator(0);
  auto mlp_model = mlp(kDims, "relu", &generator);
  const Tensor x = randn({kBatch, kDims.front()}, &generator);
  const Tensor y = from_vector(std::vector<int64_t>(kBatch, 0), {kBatch});
  CrossEntropyLoss loss;
  std::vector<double> times;
  for (int i = 0; i < 15; ++i) {
    const auto start = Clock::now();
    mlp_model->zero_grad();
    Tensor out = mlp_model->forward(x);
    out.backward(loss.compute_gradient(out, y));
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  m.mlp_compute_ms = bench::median(times);
  return m;
}

// Step-time bound of a row (ms), from the machine and what the row itself measured.
double bound_ms(const Machine& m, const RowSpec& r, const bench::PsTimes& row) {
  const double bytes = static_cast<double>(model_bytes());
  const double traffic = 2.0 * r.workers * bytes / m.bytes_per_ms;
  return std::max({row.compute_ms, traffic, row.busiest_shard_ms}) + bytes / m.bytes_per_ms +
         m.round_trip_ms;
}

struct Case {
  std::string name;
  int64_t layer_us = 0;
};

// One case's table: per transport and mode, k shards against 1 to 16 workers.
std::string case_table(const Case& c, const Machine& m, const support::Flags& flags,
                       const fs::path& dir, std::string& summary) {
  std::ostringstream out;
  const double compute_ms = 9.0 * static_cast<double>(c.layer_us) / 1000.0;
  out << "\n"
      << c.name << ": " << format("%.2f", compute_ms)
      << " ms of compute per step (3 sleeping layers, backward twice the forward), "
      << format("%.2f", model_bytes() / 1e6) << " MB of gradients and as many of parameters per "
      << "worker step.\n\n| transport | mode | k | workers | samples/s | efficiency | bound "
         "samples/s | measured / bound | compute ms/step | busiest shard ms/step |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n";
  std::printf("%s", out.str().c_str());
  for (const std::string& transport : flags.items("transports")) {
    for (const std::string& mode : flags.items("modes")) {
      std::map<int, double> one_server;  // workers -> k = 1 samples/s
      for (const std::string& k_text : flags.items("shard-counts")) {
        const int k = std::stoi(k_text);
        double single = 0;
        for (const std::string& w_text : flags.items("worker-counts")) {
          const int workers = std::stoi(w_text);
          const RowSpec r{mode, transport, k, workers, c.layer_us, flags.integer("steps")};
          const fs::path row_dir = dir / format("%s_%s_%s_%d_%d", c.name.substr(0, 4).c_str(),
                                                transport.c_str(), mode.c_str(), k, workers);
          fs::create_directories(row_dir);
          const std::optional<bench::PsTimes> measured = measure(r, row_dir);
          std::string line =
              format("| %s | %s | %d | %d | ", transport.c_str(), mode.c_str(), k, workers);
          if (!measured) {
            line += "failed | | | | | |\n";
          } else {
            const bench::PsTimes& row = *measured;
            if (workers == 1) single = row.samples_per_s;
            if (k == 1) one_server[workers] = row.samples_per_s;
            const double bound = workers * kBatch * 1000.0 / bound_ms(m, r, row);
            line += format("%.0f | %.2f | %.0f | %.2f | %.2f | %.2f |\n", row.samples_per_s,
                           row.samples_per_s / (workers * single), bound, row.samples_per_s / bound,
                           row.compute_ms, row.busiest_shard_ms);
            if (k == 4 && workers == 16) {
              summary += format(
                  "- %s, %s %s, k = 4, 16 workers: efficiency %.2f, %.2fx the "
                  "one-server throughput, %.2f of the bound\n",
                  c.name.c_str(), transport.c_str(), mode.c_str(),
                  row.samples_per_s / (workers * single), row.samples_per_s / one_server[16],
                  row.samples_per_s / bound);
            }
          }
          std::printf("%s", line.c_str());
          std::fflush(stdout);
          out << line;
        }
      }
    }
  }
  return out.str();
}

int run(const support::Flags& flags) {
  const fs::path dir =
      fs::temp_directory_path() / ("pipit_bench_ps_scale_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const Machine m = measure_machine();
  const double bytes16 = 16 * 2.0 * static_cast<double>(model_bytes());
  std::ostringstream out;
  out << "`build/ps_scale --steps " << flags.integer("steps") << "`: k parameter-server shards "
      << "and 1-16 workers, each a process of this machine (over TCP on 127.0.0.1, or mpirun "
         "ranks), batch "
      << kBatch << " per worker, SGD, " << kWarmup << " warm-up steps and "
      << flags.integer("steps")
      << " timed ones per worker. Pushes overlap the backward (PsConfig::overlap). Measured here "
         "first: loopback "
      << format("%.2f", m.bytes_per_ms / 1e6) << " GB/s (raw sockets, one stream), round trip "
      << format("%.1f", m.round_trip_ms * 1000) << " us, the real MLP's step "
      << format("%.2f", m.mlp_compute_ms) << " ms; the 16-worker step's bytes take "
      << format("%.1f", bytes16 / m.bytes_per_ms) << " ms at that bandwidth.\n";
  std::printf("%s", out.str().c_str());
  std::string summary;
  for (const std::string& name : flags.items("cases")) {
    const double compute_ms = name == "comm" ? m.mlp_compute_ms : 3.0 * bytes16 / m.bytes_per_ms;
    const Case c{name == "comm" ? "communication-heavy" : "compute-heavy",
                 std::llround(compute_ms * 1000.0 / 9.0)};
    out << case_table(c, m, flags, dir, summary);
  }
  out << "\n" << summary;
  std::printf("\n%s", summary.c_str());
  fs::remove_all(dir);
  if (!flags.on("no-append")) bench::append_results("ps_scale", out.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("ps_scale",
                       "The parameter server's k shards x 1-16 workers against its cost model.");
  flags.add("steps", "12", "timed steps per worker and row");
  flags.add("cases", "comm,compute", "communication-heavy (comm), compute-heavy (compute)");
  flags.add("transports", "tcp,mpi", "tcp (processes over 127.0.0.1), mpi (mpirun ranks)");
  flags.add("modes", "sync,async", "the parameter server's modes to measure");
  flags.add("shard-counts", "1,2,4,8", "k, the shards of each row (1 first: the reference)");
  flags.add("worker-counts", "1,2,4,8,16", "workers of each row (1 first: the reference)");
  flags.add_switch("no-append", "print only; do not append to bench/RESULTS.md");
  bench::add_ps_role_flags(flags);
  flags.add("mode", "sync", "internal, with --role");
  flags.add("k", "1", "internal, with --role: shards");
  flags.add("w", "1", "internal, with --role: workers");
  flags.add("layer-us", "0", "internal, with --role: a sleeping layer's forward");
  flags.parse(argc, argv);
  support::register_sleep_layer();
  support::register_ballast_layer();
  const std::string role = flags.choice("role", {"", "server", "worker", "rank"});
  try {
    if (role.empty()) return run(flags);
    set_num_threads(1);
    const PsConfig config = config_of(flags);
    const int64_t layer_us = flags.integer("layer-us", 0);
    if (role == "server") return bench::ps_server_role(flags, config, *emulated_mlp(layer_us));
    if (role == "worker") {
      return bench::ps_worker_role(flags, config, emulated_mlp(layer_us), ones({kBatch, 1}),
                                   zeros({kBatch, 1}), kWarmup);
    }
    return rank_role(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_scale: %s\n", e.what());
    return 1;
  }
}
