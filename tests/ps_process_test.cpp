// Parameter server across processes: sync over TCP processes and on bare pipit-workers
// equals the large batch bit for bit; a killed worker (async goes on, sync fails naming it);
// a killed server (workers name it, a resumed run equals an unbroken one); a bad package.
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "distributed_reference.h"
#include "pipit.h"
#include "ps/checkpoint.h"
#include "ps/launch.h"
#include "ps_reference.h"
#include "ps_task.h"
#include "serialize/checkpoint.h"
#include "support/child_process.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;

namespace {

// A parameter-server run whose servers and workers are processes of this executable
// (tests/ps_task.h), with their logs and checkpoints in one directory.
class PsProcesses {
 public:
  explicit PsProcesses(const std::string& name)
      : dir_(fs::temp_directory_path() / ("pipit_ps_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~PsProcesses() {
    children_.clear();
    fs::remove_all(dir_);
  }

  // Starts shard s and waits for its port; returns its "host:port".
  std::string start_server(int s, const nlohmann::json& config) {
    const std::string name = "server" + std::to_string(s);
    const std::string port_file = (dir_ / ("port" + std::to_string(s))).string();
    fs::remove(port_file);
    support::ChildProcess& child =
        start(name, {"server", std::to_string(s), config.dump(), port_file, dir_.string()});
    return "127.0.0.1:" + support::wait_for_file(child, port_file, std::chrono::seconds(10),
                                                 (dir_ / (name + ".log")).string());
  }
  std::string start_servers(const nlohmann::json& config) {
    std::string endpoints;
    for (int s = 0; s < config.at("servers").get<int>(); ++s) {
      if (s > 0) endpoints += ",";
      endpoints += start_server(s, config);
    }
    return endpoints;
  }
  support::ChildProcess& start_worker(int w, const nlohmann::json& config,
                                      const std::string& endpoints, int64_t steps) {
    return start("worker" + std::to_string(w),
                 {"worker", std::to_string(w), config.dump(), endpoints, std::to_string(steps)});
  }
  // train_ps in threads of one process (tests/ps_task.h's "threads" role).
  support::ChildProcess& start_threads(const nlohmann::json& config, int64_t steps) {
    return start("threads", {"threads", "0", config.dump(), dir_.string(), std::to_string(steps)});
  }
  std::string dir() const { return dir_.string(); }
  support::ChildProcess& child(const std::string& name) { return *children_.at(name); }
  // Waits for the process to exit; its exit status.
  int wait(const std::string& name) {
    INFO(name << ": " << log(name));
    REQUIRE(child(name).wait_exit(support::ChildProcess::Clock::now() + std::chrono::seconds(120)));
    return *child(name).exit_status();
  }
  std::string log(const std::string& name) const {
    return fs::exists(dir_ / (name + ".log")) ? read_file((dir_ / (name + ".log")).string()) : "";
  }
  std::string checkpoint(int s, int servers) const {
    return shard_checkpoint_path(dir_.string(), s, servers);
  }
  StateDict weights(int servers) const {
    StateDict all;
    for (int s = 0; s < servers; ++s) {
      for (auto& [name, value] : load_checkpoint(checkpoint(s, servers)).weights) {
        all.emplace(name, value);
      }
    }
    return all;
  }

 private:
  support::ChildProcess& start(const std::string& name, std::vector<std::string> role) {
    std::vector<std::string> argv = {fs::read_symlink("/proc/self/exe").string(), "--ps-role"};
    argv.insert(argv.end(), role.begin(), role.end());
    const std::string path = (dir_ / (name + ".log")).string();
    children_[name] = std::make_unique<support::ChildProcess>(argv, path, path);
    return *children_[name];
  }

  fs::path dir_;
  std::map<std::string, std::unique_ptr<support::ChildProcess>> children_;
};

nlohmann::json role_config(const std::string& mode, int servers, int workers,
                           const nlohmann::json& optimizer) {
  return {{"mode", mode}, {"servers", servers}, {"workers", workers}, {"optimizer", optimizer}};
}

}  // namespace

TEST_CASE("sync over TCP worker and server processes equals the large batch bit for bit",
          "[ps][distributed]") {
  const PsTask task(512);
  for (const auto& optimizer : {kSgd, kAdamW}) {
    for (int servers : {1, 2}) {
      DYNAMIC_SECTION(optimizer["type"].get<std::string>() << ", " << servers << " shard(s)") {
        PsProcesses run("sync");
        const nlohmann::json config = role_config("sync", servers, kSyncWorkers, optimizer);
        const std::string endpoints = run.start_servers(config);
        for (int w = 0; w < kSyncWorkers; ++w) run.start_worker(w, config, endpoints, kSyncSteps);
        for (int w = 0; w < kSyncWorkers; ++w) CHECK(run.wait("worker" + std::to_string(w)) == 0);
        for (int s = 0; s < servers; ++s) CHECK(run.wait("server" + std::to_string(s)) == 0);
        check_bitwise_equal(run.weights(servers), large_batch_reference(optimizer, task).first);
      }
    }
  }
}

TEST_CASE("a killed worker process: async goes on and logs it, sync fails naming it",
          "[ps][distributed]") {
  for (const std::string mode : {"async", "sync"}) {
    DYNAMIC_SECTION(mode) {
      PsProcesses run("killed_worker");
      const nlohmann::json config = role_config(mode, 2, 3, kSgd);
      const std::string endpoints = run.start_servers(config);
      // Async: workers 0 and 1 finish; worker 2 would run for ever. Sync: all would.
      const int64_t steps = mode == "async" ? 20 : 1000000;
      run.start_worker(0, config, endpoints, steps);
      run.start_worker(1, config, endpoints, steps);
      run.start_worker(2, config, endpoints, 1000000);
      // Worker 2 is killed once every worker has joined every shard (a slow machine, an ASan
      // build under load, may take a while to start them): a worker that had not yet joined
      // would fail to connect instead of hearing that worker 2 was lost.
      for (const std::string worker : {"worker0", "worker1", "worker2"}) {
        for (int i = 0; i < 6000 && run.log(worker).find("joined") == std::string::npos; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        REQUIRE(run.log(worker).find("joined") != std::string::npos);
      }
      if (mode == "async") {
        CHECK(run.wait("worker0") == 0);
        CHECK(run.wait("worker1") == 0);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      run.child("worker2").kill();
      // Sync: the first shard to notice fails and tells the workers, which then stop; the
      // other shard may see one of them go before it sees worker 2 go, and names that one.
      int named_the_killed_worker = 0;
      for (int s = 0; s < 2; ++s) {
        const std::string server = "server" + std::to_string(s);
        if (mode == "async") {
          CHECK(run.wait(server) == 0);
          CHECK_THAT(run.log(server), Catch::Contains("worker 2 lost"));
          CHECK(load_checkpoint(run.checkpoint(s, 2)).step >= 40);
        } else {
          CHECK(run.wait(server) == 1);
          CHECK_THAT(run.log(server), Catch::Contains("lost worker"));
          named_the_killed_worker += run.log(server).find("lost worker 2") != std::string::npos;
        }
      }
      if (mode == "sync") {
        CHECK(named_the_killed_worker >= 1);
        for (const std::string worker : {"worker0", "worker1"}) {
          CHECK(run.wait(worker) == 1);
          CHECK_THAT(run.log(worker), Catch::Contains("lost worker"));
        }
      }
    }
  }
}

TEST_CASE("a killed server: workers stop naming it, and a resumed run equals an unbroken one",
          "[ps][distributed]") {
  const PsTask task(512);
  constexpr int64_t kSteps = 40;
  PsProcesses run("killed_server");
  nlohmann::json config = role_config("sync", 1, 2, kSgd);
  config["checkpoint_every"] = 5;
  nlohmann::json slow = config;
  slow["slowdown"] = 30.0;  // long enough steps to kill the server mid-run
  std::string endpoint = run.start_server(0, config);
  run.start_worker(0, slow, endpoint, kSteps);
  run.start_worker(1, slow, endpoint, kSteps);
  // Kill the server once it has checkpointed at least 10 updates.
  for (int i = 0; i < 3000; ++i) {
    if (fs::exists(run.checkpoint(0, 1)) && load_checkpoint(run.checkpoint(0, 1)).step >= 10) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.child("server0").kill();
  const int64_t saved = load_checkpoint(run.checkpoint(0, 1)).step;
  INFO("killed after the checkpoint of version " << saved);
  CHECK(saved >= 10);
  CHECK(saved < kSteps);
  for (const std::string worker : {"worker0", "worker1"}) {
    CHECK(run.wait(worker) == 1);
    CHECK_THAT(run.log(worker), Catch::Contains("lost server shard 0"));
  }
  config["resume"] = true;
  endpoint = run.start_server(0, config);
  run.start_worker(0, config, endpoint, kSteps);
  run.start_worker(1, config, endpoint, kSteps);
  CHECK(run.wait("worker0") == 0);
  CHECK(run.wait("worker1") == 0);
  CHECK(run.wait("server0") == 0);
  CHECK(load_checkpoint(run.checkpoint(0, 1)).step == kSteps);

  // The unbroken run: the large batch, kSteps steps, 2 workers.
  auto reference = make_ps_mlp();
  auto optimizer = make_optimizer(kSgd, reference->named_parameters());
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  for (int64_t step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    for (int w = 0; w < 2; ++w) {
      const auto [x, y] = task.batch(2, w, step);
      Tensor out = reference->forward(x);
      out.backward(loss->compute_gradient(out, y) * 0.5);
    }
    optimizer->step();
  }
  check_bitwise_equal(run.weights(1), reference->state_dict());
}

TEST_CASE("sync on bare pipit-worker processes equals the large batch bit for bit",
          "[ps][distributed]") {
  const PsTask task(512);
  for (int servers : {1, 2}) {
    DYNAMIC_SECTION(servers << " shard(s)") {
      const Workers processes = start_workers(servers + kSyncWorkers, test_worker());
      PsRunOptions options;
      options.steps = kSyncSteps;
      options.batch = [&](int w, int64_t step) { return task.batch(kSyncWorkers, w, step); };
      const PsRunReport result =
          train_ps(*make_ps_mlp(), ps_config_of("sync", kSyncWorkers, servers, kAdamW), options,
                   PsLaunch::hosts(endpoints(processes)));
      CHECK(result.servers.at(0).version == kSyncSteps);
      check_bitwise_equal(result.weights, large_batch_reference(kAdamW, task).first);
      CHECK(result.optimizer_state.count("step"));
    }
  }
}

TEST_CASE("a bad parameter-server package is refused by name and releases the worker",
          "[ps][distributed]") {
  WorkerProcess shard(test_worker()), worker(test_worker());
  PsConfig config = ps_config_of("sync", 1, 1, kSgd);
  config.timeout = std::chrono::milliseconds(20000);
  // A worker whose batches disagree on their rows: 8 inputs, 4 targets.
  PsRunOptions options;
  options.steps = 2;
  options.batch = [](int, int64_t) {
    return std::pair{zeros({8, testing::kPsIn}), zeros({4}, {.dtype = DType::i64})};
  };
  CHECK_THROWS_WITH(train_ps(*make_ps_mlp(), config, options,
                             PsLaunch::hosts({shard.endpoint(), worker.endpoint()})),
                    Catch::Contains("worker 0 (" + worker.endpoint() + ") failed") &&
                        Catch::Contains("at least batch = 8"));
  // Both workers serve the next run.
  INFO("shard's log:\n" << shard.log() << "\nworker's log:\n" << worker.log());
  options.batch = [](int, int64_t) {
    return std::pair{zeros({8, testing::kPsIn}), zeros({8}, {.dtype = DType::i64})};
  };
  const PsRunReport result = train_ps(*make_ps_mlp(), config, options,
                                      PsLaunch::hosts({shard.endpoint(), worker.endpoint()}));
  CHECK(result.servers.at(0).version == 2);
}

// Two shards checkpoint on their own, so a run killed mid-way may leave them at different
// versions; a sync run resumes both at the newest version both saved.
TEST_CASE("a killed shard resumes bit for bit in threads and on pipit-workers",
          "[ps][distributed]") {
  const PsTask task(512);
  constexpr int64_t kSteps = kPsResumeSteps;
  const PsConfig config = ps_config_of("sync", 2, 2, kSgd);
  const StateDict unbroken = large_batch_reference(kSgd, task, 2, kSteps).first;
  PsProcesses run("killed_shard");
  PsRunOptions options;
  options.steps = kSteps;
  options.batch = [&](int w, int64_t step) { return task.batch(2, w, step); };
  options.checkpoint_dir = run.dir();
  options.checkpoint_every = 5;
  Workers fresh;  // the resumed run's pipit-workers
  PsLaunch launch = PsLaunch::threads();
  SECTION("threads: the process is killed") {
    nlohmann::json role = role_config("sync", 2, 2, kSgd);
    role["checkpoint_every"] = 5;
    role["kill_at"] = 10;
    run.start_threads(role, kSteps);
    CHECK(run.wait("threads") == 128 + SIGKILL);
  }
  SECTION("pipit-workers: shard 1's host is killed") {
    const Workers hosts = start_workers(4, test_worker());
    OnCheckpoint kill(shard_checkpoint_path(run.dir(), 1, 2), 10, [&] { hosts[1]->kill(); });
    CHECK_THROWS_WITH(train_ps(*make_ps_mlp(), config, options, PsLaunch::hosts(endpoints(hosts))),
                      Catch::Contains("shard 1"));
    fresh = start_workers(4, test_worker());
    launch = PsLaunch::hosts(endpoints(fresh));
  }
  const int64_t saved = common_checkpoint_version(run.dir(), 2);
  INFO("resumed at version " << saved);
  // Shard 1 was killed once it saved version 10; shard 0, up to one update behind, may not
  // have saved 10 yet, and then both resume at 5.
  CHECK(saved >= 10 - options.checkpoint_every);
  CHECK(saved < kSteps);
  options.resume = true;
  const PsRunReport resumed = train_ps(*make_ps_mlp(), config, options, launch);
  CHECK(resumed.servers.at(0).version == kSteps);
  CHECK(resumed.first_step == saved);  // the workers began where the checkpoints were
  check_bitwise_equal(resumed.weights, unbroken);
}
