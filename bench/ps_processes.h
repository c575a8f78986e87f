#pragma once
// The parameter-server benchmarks' processes (bench/ps, bench/ps_scale): the benchmark starts
// itself again, once per shard and once per worker, each a process talking TCP on 127.0.0.1,
// and reads the times each role wrote to its JSON file.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "codec/atomic_file.h"
#include "pipit.h"
#include "ps/parameter_server.h"
#include "ps/shard_plan.h"
#include "ps/tcp.h"
#include "ps/worker.h"
#include "support/child_process.h"
#include "support/flags.h"

namespace pipit::bench {

// The MLP both measure (or whose bytes they emulate), and each worker's batch.
inline const std::vector<int64_t> kMlpDims = {784, 1024, 1024, 10};
constexpr int64_t kBatch = 64;

// The flags the roles read.
inline void add_ps_role_flags(support::Flags& flags) {
  flags.add("role", "", "internal: server or worker, a process of one measurement");
  flags.add("index", "0", "internal, with --role: the shard's or worker's index");
  flags.add("port-file", "", "internal, with --role server: where to write its port");
  flags.add("endpoints", "", "internal, with --role worker: the shards' host:port");
  flags.add("out", "", "internal, with --role: where the role writes its times");
}

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What a worker writes: its timed steps' span (steady-clock seconds) and per-step means.
inline nlohmann::json ps_worker_times(double start, double end, int64_t steps, double compute_ms,
                                      double wait_ms) {
  return {{"start", start},
          {"end", end},
          {"steps", steps},
          {"compute_ms", compute_ms},
          {"wait_ms", wait_ms}};
}

// What a shard writes: its work and the gradients it summed.
inline nlohmann::json ps_server_times(const PsServerStats& stats) {
  return {{"busy_ms", stats.busy_ms}, {"gradients", stats.gradients}};
}

// A shard: serves shard --index of `model`'s parameters, writes its port to --port-file, and
// once every worker has left, {"busy_ms", "gradients"} to --out.
inline int ps_server_role(const support::Flags& flags, const PsConfig& config,
                          const Module& model) {
  const int shard = static_cast<int>(flags.integer("index", 0));
  uint16_t port = 0;
  auto comm = listen_as_ps_shard(config, shard, "127.0.0.1:0", {}, &port);
  const NamedParameters all = model.named_parameters();
  ParameterServer server(comm, shard_parameters(all, plan_shards(all, config.servers), shard),
                         config, shard);
  write_file_atomic(flags.str("port-file"), std::to_string(port));
  server.serve();
  write_file_atomic(flags.str("out"), ps_server_times(server.stats()).dump());
  comm->close();
  return 0;
}

// A worker: worker --index joins the shards at --endpoints, trains `warmup` untimed steps and
// --steps timed ones on (x, y), and writes ps_worker_times to --out.
inline int ps_worker_role(const support::Flags& flags, const PsConfig& config,
                          std::shared_ptr<Module> model, const Tensor& x, const Tensor& y,
                          int64_t warmup) {
  const int index = static_cast<int>(flags.integer("index", 0));
  auto comm = connect_as_ps_worker(config, index, flags.items("endpoints"), {});
  const int64_t steps = flags.integer("steps");
  PsWorker worker(comm, std::move(model), config, index);
  worker.join();
  for (int64_t i = 0; i < warmup; ++i) worker.step(x, y);
  const PsWorkerStats before = worker.stats();
  const double start = steady_seconds();
  for (int64_t i = 0; i < steps; ++i) worker.step(x, y);
  const double end = steady_seconds();
  const PsWorkerStats after = worker.stats();
  worker.leave();
  comm->close();
  const auto per_step = [&](double total) { return total / static_cast<double>(steps); };
  write_file_atomic(
      flags.str("out"),
      ps_worker_times(start, end, steps, per_step(after.compute_ms - before.compute_ms),
                      per_step(after.wait_ms - before.wait_ms))
          .dump());
  return 0;
}

struct PsTimes {
  double samples_per_s = 0;
  double compute_ms = 0, wait_ms = 0;  // per worker step, the workers' mean
  double busiest_shard_ms = 0;         // the busiest shard's work per step
  double server_ms_per_gradient = 0;   // every shard's work for one worker's gradient
};

// The times the roles of one measurement wrote in `dir` ("server<s>.json", "worker<w>.json").
inline PsTimes read_ps_times(const std::filesystem::path& dir, int shards, int workers,
                             int64_t batch) {
  auto read = [&](const std::string& name) {
    return nlohmann::json::parse(read_file((dir / (name + ".json")).string()));
  };
  PsTimes t;
  double first = 1e300, last = 0;
  int64_t steps = 0;
  for (int w = 0; w < workers; ++w) {
    const nlohmann::json r = read("worker" + std::to_string(w));
    first = std::min(first, r.at("start").get<double>());
    last = std::max(last, r.at("end").get<double>());
    steps = r.at("steps").get<int64_t>();
    t.compute_ms += r.at("compute_ms").get<double>() / workers;
    t.wait_ms += r.at("wait_ms").get<double>() / workers;
  }
  for (int s = 0; s < shards; ++s) {
    const nlohmann::json r = read("server" + std::to_string(s));
    const double busy = r.at("busy_ms").get<double>(), gradients = r.at("gradients").get<double>();
    t.busiest_shard_ms = std::max(t.busiest_shard_ms, busy / (gradients / workers));
    t.server_ms_per_gradient += busy / gradients;
  }
  t.samples_per_s = static_cast<double>(workers * steps * batch) / (last - first);
  return t;
}

// Starts `shards` server processes, then `workers` worker processes of this program (`argv`:
// the program and the measurement's flags, to which each role's are added), waits for them
// all and reads their times. An Error names a role that failed, with its log.
inline PsTimes run_ps_processes(const std::vector<std::string>& argv, int shards, int workers,
                                int64_t batch, const std::filesystem::path& dir) {
  std::vector<std::unique_ptr<support::ChildProcess>> children;
  std::vector<std::string> names;
  auto start = [&](const std::string& name, const std::string& role, int index,
                   const std::vector<std::string>& more) {
    std::vector<std::string> args = argv;
    args.insert(args.end(), {"--role", role, "--index", std::to_string(index), "--out",
                             (dir / (name + ".json")).string()});
    args.insert(args.end(), more.begin(), more.end());
    const std::string log = (dir / (name + ".log")).string();
    children.push_back(std::make_unique<support::ChildProcess>(args, log, log));
    names.push_back(name);
  };
  std::string endpoints;
  for (int s = 0; s < shards; ++s) {
    std::string name = "server";
    name += std::to_string(s);
    const std::filesystem::path port = dir / (name + ".port");
    std::filesystem::remove(port);
    start(name, "server", s, {"--port-file", port.string()});
    if (s > 0) endpoints += ",";
    endpoints += "127.0.0.1:";
    endpoints += support::wait_for_file(*children.back(), port.string(), std::chrono::seconds(20),
                                        (dir / (name + ".log")).string());
  }
  for (int w = 0; w < workers; ++w) {
    start("worker" + std::to_string(w), "worker", w, {"--endpoints", endpoints});
  }
  for (size_t i = 0; i < children.size(); ++i) {
    const bool exited =
        children[i]->wait_exit(std::chrono::steady_clock::now() + std::chrono::minutes(10));
    PIPIT_CHECK(exited && children[i]->exit_status() == 0, names[i],
                " failed: ", read_file((dir / (names[i] + ".log")).string()));
  }
  return read_ps_times(dir, shards, workers, batch);
}

}  // namespace pipit::bench
