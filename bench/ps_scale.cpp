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
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

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

const std::vector<int64_t> kDims = {784, 1024, 1024, 10};
constexpr int64_t kBatch = 64, kWarmup = 3;

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

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// A worker's timed steps, as its process or rank writes them.
json worker_times(double compute_ms_per_step, double start, double end, int64_t steps) {
  return {{"start", start}, {"end", end}, {"steps", steps}, {"compute_ms", compute_ms_per_step}};
}

json server_work(const PsServerStats& s, int64_t steps) {
  return {{"busy_ms_per_step", s.busy_ms / static_cast<double>(steps)}};
}

int server_role(const support::Flags& flags) {
  const PsConfig config = config_of(flags);
  const int shard = static_cast<int>(flags.integer("index", 0));
  uint16_t port = 0;
  auto comm = listen_as_ps_shard(config, shard, "127.0.0.1:0", {}, &port);
  const NamedParameters all = emulated_mlp(0)->named_parameters();
  ParameterServer server(comm, shard_parameters(all, plan_shards(all, config.servers), shard),
                         config, shard);
  write_file_atomic(flags.str("port-file"), std::to_string(port));
  server.serve();
  write_file_atomic(flags.str("out"),
                    server_work(server.stats(), kWarmup + flags.integer("steps")).dump());
  comm->close();
  return 0;
}

int worker_role(const support::Flags& flags) {
  const PsConfig config = config_of(flags);
  const int index = static_cast<int>(flags.integer("index", 0));
  auto comm = connect_as_ps_worker(config, index, flags.items("endpoints"), {});
  const int64_t steps = flags.integer("steps");
  const Tensor x = ones({kBatch, 1}), y = zeros({kBatch, 1});
  PsWorker worker(comm, emulated_mlp(flags.integer("layer-us", 0)), config, index);
  worker.join();
  for (int64_t i = 0; i < kWarmup; ++i) worker.step(x, y);
  const double compute_before = worker.stats().compute_ms;
  const double start = now_s();
  for (int64_t i = 0; i < steps; ++i) worker.step(x, y);
  const double end = now_s();
  const json times = worker_times(
      (worker.stats().compute_ms - compute_before) / static_cast<double>(steps), start, end, steps);
  worker.leave();
  comm->close();
  write_file_atomic(flags.str("out"), times.dump());
  return 0;
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
    if (step == kWarmup - 1) start = now_s();
    end = now_s();
  };
  const PsRunReport report =
      train_ps(*emulated_mlp(flags.integer("layer-us", 0)), config, options, PsLaunch::mpi());
  const fs::path out = flags.str("out");
  for (size_t w = 0; w < report.losses.size(); ++w) {
    if (report.losses[w].empty()) continue;
    // Compute per step over every step, the warm-up's included: train_ps reports totals.
    const json times = worker_times(
        report.workers[w].compute_ms / static_cast<double>(kWarmup + steps), start, end, steps);
    write_file_atomic((out / ("worker" + std::to_string(w) + ".json")).string(), times.dump());
  }
  for (size_t s = 0; s < report.servers.size(); ++s) {
    if (report.servers[s].gradients == 0) continue;
    write_file_atomic((out / ("server" + std::to_string(s) + ".json")).string(),
                      server_work(report.servers[s], kWarmup + steps).dump());
  }
  return 0;
}

struct Row {
  double samples_per_s = 0, compute_ms = 0, server_ms = 0;
  bool ok = false;
};

// The row's measurement from the roles' JSON files in `dir`.
Row gather(const fs::path& dir, int shards, int workers) {
  Row row;
  double first = 1e300, last = 0;
  int64_t steps = 0;
  for (int w = 0; w < workers; ++w) {
    const json r =
        json::parse(read_file((dir / ("worker" + std::to_string(w) + ".json")).string()));
    first = std::min(first, r.at("start").get<double>());
    last = std::max(last, r.at("end").get<double>());
    steps = r.at("steps").get<int64_t>();
    row.compute_ms += r.at("compute_ms").get<double>() / workers;
  }
  for (int s = 0; s < shards; ++s) {
    const json r =
        json::parse(read_file((dir / ("server" + std::to_string(s) + ".json")).string()));
    row.server_ms = std::max(row.server_ms, r.at("busy_ms_per_step").get<double>());
  }
  row.samples_per_s = static_cast<double>(workers * steps * kBatch) / (last - first);
  row.ok = true;
  return row;
}

struct RowSpec {
  std::string mode, transport;
  int shards = 1, workers = 1;
  int64_t layer_us = 0, steps = 0;
};

std::vector<std::string> role_argv(const RowSpec& r, const std::string& role) {
  return {fs::read_symlink("/proc/self/exe").string(),
          "--role",
          role,
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

Row measure_tcp(const RowSpec& r, const fs::path& dir) {
  std::vector<std::unique_ptr<support::ChildProcess>> children;
  auto start = [&](const std::string& name, const std::string& role, int index,
                   std::vector<std::string> more) {
    std::vector<std::string> argv = role_argv(r, role);
    more.insert(more.end(),
                {"--index", std::to_string(index), "--out", (dir / (name + ".json")).string()});
    argv.insert(argv.end(), more.begin(), more.end());
    const std::string log = (dir / (name + ".log")).string();
    children.push_back(std::make_unique<support::ChildProcess>(argv, log, log));
  };
  std::string endpoints;
  for (int s = 0; s < r.shards; ++s) {
    std::string name = "server";
    name += std::to_string(s);
    const fs::path port = dir / (name + ".port");
    fs::remove(port);
    start(name, "server", s, {"--port-file", port.string()});
    if (s > 0) endpoints += ",";
    endpoints += "127.0.0.1:";
    endpoints += support::wait_for_file(*children.back(), port.string(), std::chrono::seconds(20),
                                        (dir / (name + ".log")).string());
  }
  for (int w = 0; w < r.workers; ++w) {
    start("worker" + std::to_string(w), "worker", w, {"--endpoints", endpoints});
  }
  for (auto& child : children) {
    if (!child->wait_exit(Clock::now() + std::chrono::minutes(10)) || child->exit_status() != 0) {
      std::fprintf(stderr, "ps_scale: a %s role failed; logs in %s\n", r.mode.c_str(), dir.c_str());
      return {};
    }
  }
  return gather(dir, r.shards, r.workers);
}

Row measure_mpi(const RowSpec& r, const fs::path& dir) {
  std::string command =
      "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(r.shards + r.workers);
  for (const std::string& arg : role_argv(r, "rank")) command += " " + arg;
  command += " --out " + dir.string() + " > " + (dir / "mpirun.log").string() + " 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "ps_scale: mpirun failed; see %s\n", (dir / "mpirun.log").c_str());
    return {};
  }
  return gather(dir, r.shards, r.workers);
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
double bound_ms(const Machine& m, const RowSpec& r, const Row& row) {
  const double bytes = static_cast<double>(model_bytes());
  const double traffic = 2.0 * r.workers * bytes / m.bytes_per_ms;
  return std::max({row.compute_ms, traffic, row.server_ms}) + bytes / m.bytes_per_ms +
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
          const Row row = transport == "tcp" ? measure_tcp(r, row_dir) : measure_mpi(r, row_dir);
          std::string line =
              format("| %s | %s | %d | %d | ", transport.c_str(), mode.c_str(), k, workers);
          if (!row.ok) {
            line += "failed | | | | | |\n";
          } else {
            if (workers == 1) single = row.samples_per_s;
            if (k == 1) one_server[workers] = row.samples_per_s;
            const double bound = workers * kBatch * 1000.0 / bound_ms(m, r, row);
            line += format("%.0f | %.2f | %.0f | %.2f | %.2f | %.2f |\n", row.samples_per_s,
                           row.samples_per_s / (workers * single), bound, row.samples_per_s / bound,
                           row.compute_ms, row.server_ms);
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
  flags.add("role", "", "internal: server, worker or rank, a process of one row");
  flags.add("mode", "sync", "internal, with --role");
  flags.add("k", "1", "internal, with --role: shards");
  flags.add("w", "1", "internal, with --role: workers");
  flags.add("layer-us", "0", "internal, with --role: a sleeping layer's forward");
  flags.add("index", "0", "internal, with --role server or worker");
  flags.add("port-file", "", "internal, with --role server");
  flags.add("endpoints", "", "internal, with --role worker: the shards' host:port");
  flags.add("out", "", "internal, with --role: where the role writes its times");
  flags.parse(argc, argv);
  support::register_sleep_layer();
  support::register_ballast_layer();
  const std::string role = flags.choice("role", {"", "server", "worker", "rank"});
  try {
    if (role.empty()) return run(flags);
    set_num_threads(1);
    if (role == "server") return server_role(flags);
    if (role == "worker") return worker_role(flags);
    return rank_role(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_scale: %s\n", e.what());
    return 1;
  }
}
