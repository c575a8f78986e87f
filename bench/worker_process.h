#pragma once
// Worker processes for the benchmarks that run a pipeline across processes (bench/rebalance,
// bench/pipeline_schedules): a worker serving one run, started by the benchmark itself and
// stopped when the object goes. Sleep-cost models need workers that know SleepLayer: the
// benchmark's own binary in its worker role (worker_role: pipit-worker's flags after
// --worker); others use pipit-worker.
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codec/atomic_file.h"
#include "pipeline/remote/worker.h"
#include "pipit.h"
#include "support/sleep_layer.h"
#include "support/worker_main.h"

extern char** environ;

namespace pipit::bench {

class Worker {
 public:
  // Worker `index` of a run, its port file and log in `dir`; `slowdown` stretches its stage.
  Worker(const std::filesystem::path& dir, int index, double slowdown, bool sleep_cost) {
    namespace fs = std::filesystem;
    const fs::path self = fs::read_symlink("/proc/self/exe");
    const std::string binary =
        sleep_cost ? self.string() : (self.parent_path() / "pipit-worker").string();
    const std::string port_file = (dir / ("port" + std::to_string(index))).string();
    std::vector<std::string> args = {binary,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--runs",
                                     "1",
                                     "--port-file",
                                     port_file,
                                     "--threads",
                                     "1",
                                     "--slowdown",
                                     std::to_string(slowdown)};
    if (sleep_cost) args.insert(args.begin() + 1, "--worker");
    fs::remove(port_file);  // an earlier worker's
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = (dir / ("worker" + std::to_string(index) + ".log")).string();
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    PIPIT_CHECK(posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ) == 0,
                "cannot start ", binary);
    posix_spawn_file_actions_destroy(&actions);
    for (int i = 0; i < 500 && !fs::exists(port_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    PIPIT_CHECK(fs::exists(port_file), binary, " wrote no port within 5 s (log: ", log, ")");
    std::string port = read_file(port_file);
    while (!port.empty() && (port.back() == '\n' || port.back() == ' ')) port.pop_back();
    endpoint_ = "127.0.0.1:" + port;
  }
  ~Worker() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  const std::string& endpoint() const { return endpoint_; }

 private:
  pid_t pid_ = 0;
  std::string endpoint_;
};

// The worker role of a benchmark binary (`BINARY --worker FLAGS`): pipit-worker, with
// SleepLayer known. True when argv asks for it; then `status` is the worker's exit status.
inline bool worker_role(int argc, char** argv, int& status) {
  if (argc < 2 || std::string(argv[1]) != "--worker") return false;
  register_sleep_layer();
  status = samples::worker_main(argc - 1, argv + 1, std::string(argv[0]) + " --worker");
  return true;
}

}  // namespace pipit::bench
