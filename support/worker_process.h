#pragma once
// A pipit worker in a process of its own, for tests and benchmarks that run a pipeline or a
// parameter server across processes: WorkerProcess starts one (a ChildProcess) listening on a
// port the system picks, and the worker role serves in the started program. Tests and
// benchmarks start themselves in that role (`PROGRAM --worker FLAGS`), so stage packages may
// hold SleepLayer; others start pipit-worker, which sits beside them in the build.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "support/child_process.h"
#include "support/sleep_layer.h"
#include "support/worker_main.h"

namespace pipit::support {

// Whether argv asks for the worker role: argv[1] is --worker.
inline bool worker_role_requested(int argc, char** argv) {
  return argc > 1 && std::strcmp(argv[1], "--worker") == 0;
}

// Serves as pipit-worker with the flags after --worker, SleepLayer known; the exit status.
inline int worker_role_main(int argc, char** argv) {
  register_sleep_layer();
  const std::string program = std::filesystem::path(argv[0]).filename().string() + " --worker";
  return worker_main(argc - 1, argv + 1, program);
}

// Every member has an initializer, so that a designated initializer may leave any out.
struct WorkerLaunch {
  // false: this program in its worker role; true: pipit-worker beside it.
  bool pipit_worker = false;
  // pipit-worker flags beyond --listen, --port-file and --threads 1.
  std::vector<std::string> flags = {};
  // The token coordinators must prove (written to a file only the worker reads); empty: none.
  std::string token = "";
  // Run inside this network namespace (`ip netns exec`), listening on `host`.
  std::string netns = "";
  std::string host = "127.0.0.1";
};

class WorkerProcess {
 public:
  explicit WorkerProcess(const WorkerLaunch& launch = {}) : host_(launch.host) {
    namespace fs = std::filesystem;
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("pipit_worker_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    const fs::path self = fs::read_symlink("/proc/self/exe");
    const std::string port_file = (dir_ / "port").string();
    // Several workers share the machine's cores: one thread each keeps them from spinning
    // against each other.
    const fs::path program = launch.pipit_worker ? self.parent_path() / "pipit-worker" : self;
    std::vector<std::string> argv = {
        program.string(), "--listen", launch.host + ":0", "--port-file", port_file,
        "--threads",      "1"};
    if (!launch.pipit_worker) argv.insert(argv.begin() + 1, "--worker");
    // `ip netns exec` runs the worker in place of itself: the child is the worker.
    if (!launch.netns.empty()) argv.insert(argv.begin(), {"ip", "netns", "exec", launch.netns});
    if (!launch.token.empty()) {
      const std::string token_file = (dir_ / "token").string();
      write_file_atomic(token_file, launch.token);
      fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write);
      argv.insert(argv.end(), {"--token-file", token_file});
    }
    argv.insert(argv.end(), launch.flags.begin(), launch.flags.end());
    process_ = std::make_unique<ChildProcess>(argv, log_path(), log_path());
    port_ = static_cast<uint16_t>(
        std::stoi(wait_for_file(*process_, port_file, std::chrono::seconds(20), log_path())));
  }
  ~WorkerProcess() {
    process_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  pid_t pid() const { return process_->pid(); }
  // Its stdout and stderr so far.
  std::string log() const { return read_file(log_path()); }
  // Whether the process is still running (it has not exited or crashed).
  bool alive() { return process_->running(); }
  void pause() { process_->signal(SIGSTOP); }
  void kill() { process_->kill(); }

 private:
  std::string log_path() const { return (dir_ / "log").string(); }

  std::string host_;
  std::filesystem::path dir_;
  std::unique_ptr<ChildProcess> process_;
  uint16_t port_ = 0;
};

// Workers started alike, in the order of their endpoints.
using Workers = std::vector<std::unique_ptr<WorkerProcess>>;

inline Workers start_workers(int count, const WorkerLaunch& launch = {}) {
  Workers workers;
  for (int i = 0; i < count; ++i) workers.push_back(std::make_unique<WorkerProcess>(launch));
  return workers;
}

inline std::vector<std::string> endpoints(const Workers& workers) {
  std::vector<std::string> out;
  for (const auto& worker : workers) out.push_back(worker->endpoint());
  return out;
}

// Every worker's log under a line naming it.
inline std::string logs(const Workers& workers) {
  std::string out;
  for (size_t i = 0; i < workers.size(); ++i) {
    out += "--- worker " + std::to_string(i) + " log:\n" + workers[i]->log();
  }
  return out;
}

}  // namespace pipit::support
