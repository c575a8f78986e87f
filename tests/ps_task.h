#pragma once
// The parameter-server tests' task and model, shared with their worker and server processes:
//   pipit_tests --ps-role server SHARD CONFIG PORT_FILE OUT_DIR
//   pipit_tests --ps-role worker INDEX CONFIG SHARD_ENDPOINTS STEPS
//   pipit_tests --ps-role threads 0 CONFIG OUT_DIR STEPS   (train_ps in threads; with
//     "kill_at" in CONFIG, killed by SIGKILL once the last shard has saved that version)
// CONFIG is JSON {"mode", "servers", "workers", "optimizer"} and optionally
// "checkpoint_every" (the server also saves every that many updates), "resume" (the server
// starts from its checkpoint in OUT_DIR, a worker from the step its version says) and
// "slowdown" (of the worker). A server writes its final shard checkpoint into OUT_DIR; worker
// w trains on PsTask(512).batch(workers, w, step). Errors go to stderr, with exit status 1.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "codec/atomic_file.h"
#include "nn/builders.h"
#include "pipit.h"
#include "ps/checkpoint.h"
#include "ps/launch.h"
#include "ps/parameter_server.h"
#include "ps/run.h"
#include "ps/shard_plan.h"
#include "ps/tcp.h"
#include "ps/worker.h"
#include "serialize/checkpoint.h"

namespace pipit::testing {

constexpr int64_t kPsIn = 16, kPsClasses = 4, kPsBatch = 8;
// Steps of the runs whose shard is killed and resumed.
constexpr int64_t kPsResumeSteps = 300;

// A learnable classification task: labels are the argmax of a fixed random linear map of
// the inputs; `seed` draws the inputs (a held-out set takes another).
struct PsTask {
  Tensor inputs, labels;  // [rows, kPsIn] f32, [rows] i64
  explicit PsTask(int64_t rows, uint64_t seed = 11) {
    Generator teacher_generator(10), generator(seed);
    const Tensor teacher = randn({kPsIn, kPsClasses}, &teacher_generator);
    inputs = randn({rows, kPsIn}, &generator);
    labels = argmax(matmul(inputs, teacher), 1);
  }
  std::pair<Tensor, Tensor> rows(int64_t start, int64_t count) const {
    start %= inputs.size(0) - count + 1;
    return {narrow(inputs, 0, start, count).contiguous(),
            narrow(labels, 0, start, count).contiguous()};
  }
  // Worker w's batch at `step` when `workers` train: a step's batches side by side, in worker
  // order, make its large batch.
  std::pair<Tensor, Tensor> batch(int workers, int w, int64_t step) const {
    return rows((step * workers + w) * kPsBatch, kPsBatch);
  }
};

// Calls `action` once, from a thread of its own, as soon as the checkpoint at `path` holds a
// version >= `version` (polled every millisecond); stops polling when destroyed.
class OnCheckpoint {
 public:
  OnCheckpoint(std::string path, int64_t version, std::function<void()> action)
      : thread_([this, path = std::move(path), version, action = std::move(action)] {
          while (!stop_) {
            std::error_code error;
            if (std::filesystem::exists(path, error) && saved_version(path) >= version) {
              action();
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  ~OnCheckpoint() {
    stop_ = true;
    thread_.join();
  }

 private:
  static int64_t saved_version(const std::string& path) {
    try {
      return load_checkpoint(path).step;
    } catch (const std::exception&) {
      return -1;  // being replaced
    }
  }
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

inline std::shared_ptr<Module> make_ps_mlp(int64_t hidden = 32) {
  Generator generator(3);
  return mlp({kPsIn, hidden, hidden, kPsClasses}, "relu", &generator);
}

inline PsConfig ps_config_of(const std::string& mode, int workers, int servers,
                             nlohmann::json optimizer) {
  PsConfig c;
  c.mode = mode;
  c.workers = workers;
  c.servers = servers;
  c.optimizer = std::move(optimizer);
  c.timeout = std::chrono::milliseconds(60000);
  return c;
}

// Every shard and worker a thread of this process, checkpointing to `dir`; with "kill_at" in
// `c`, the process kills itself once the last shard has saved that version.
inline int run_ps_in_threads(const PsConfig& config, const nlohmann::json& c,
                             const std::string& dir, int64_t steps) {
  const PsTask task(512);
  PsRunOptions options;
  options.steps = steps;
  options.batch = [&](int w, int64_t step) { return task.batch(config.workers, w, step); };
  options.checkpoint_dir = dir;
  options.checkpoint_every = c.value("checkpoint_every", 0);
  std::optional<OnCheckpoint> kill;
  if (c.contains("kill_at")) {
    kill.emplace(shard_checkpoint_path(dir, config.servers - 1, config.servers),
                 c.at("kill_at").get<int64_t>(), [] { std::raise(SIGKILL); });
  }
  train_ps(*make_ps_mlp(), config, options);
  return 0;
}

inline int run_ps_role(char** argv) {
  const std::string role = argv[2];
  const int index = std::stoi(argv[3]);
  const nlohmann::json c = nlohmann::json::parse(argv[4]);
  const PsConfig config =
      ps_config_of(c.at("mode"), c.at("workers"), c.at("servers"), c.at("optimizer"));
  const bool resume = c.value("resume", false);
  set_num_threads(1);
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(3000);
  if (role == "threads") return run_ps_in_threads(config, c, argv[5], std::stoll(argv[6]));
  if (role == "server") {
    uint16_t port = 0;
    auto comm = listen_as_ps_shard(config, index, "127.0.0.1:0", tcp, &port);
    auto model = make_ps_mlp();
    const NamedParameters all = model->named_parameters();
    ParameterServer server(comm, shard_parameters(all, plan_shards(all, config.servers), index),
                           config, index);
    PsRunOptions checkpoints;
    checkpoints.checkpoint_dir = argv[6];
    checkpoints.checkpoint_every = c.value("checkpoint_every", 0);
    checkpoints.resume = resume;
    start_shard(server, checkpoints, model->config());
    write_file_atomic(argv[5], std::to_string(port));
    server.serve();
    end_shard(server, checkpoints, model->config());
    comm->close();
    return 0;
  }
  std::vector<std::string> shards;
  for (std::string rest = argv[5]; !rest.empty();) {
    const size_t comma = rest.find(',');
    shards.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  auto comm = connect_as_ps_worker(config, index, shards, tcp);
  const PsTask task(512);
  PsWorker worker(comm, make_ps_mlp(), config, index, c.value("slowdown", 1.0));
  worker.join();
  std::fprintf(stderr, "joined\n");
  for (int64_t step = resume ? worker.versions().front() : 0; step < std::stoll(argv[6]); ++step) {
    const auto [x, y] = task.batch(config.workers, index, step);
    worker.step(x, y);
  }
  worker.leave();
  comm->close();
  return 0;
}

inline int ps_role_main(int argc, char** argv) {
  if (argc != 7) return 2;
  try {
    return run_ps_role(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps role %s %s: %s\n", argv[2], argv[3], e.what());
    return 1;
  }
}

}  // namespace pipit::testing
