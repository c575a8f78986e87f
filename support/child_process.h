#pragma once
// ChildProcess: a program this process started, its stdout and stderr in files (or one file, or
// /dev/null): the one launcher of the tools, benchmarks and tests. It cannot outlive its parent:
// it gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG), and the object kills
// it when it goes. It inherits no descriptor but its output files (a socket of the chaos driver's
// proxy held open by a worker would hide a closed connection from its peer).
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codec/atomic_file.h"
#include "tensor/error.h"

namespace pipit::support {

// The file to execute for `name`: itself when it holds a slash, else the first executable of
// that name on PATH, as a shell finds it. Looked up before fork: the child may only make
// async-signal-safe calls.
inline std::string executable_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', begin), dirs.size());
    const std::string dir = colon > begin ? dirs.substr(begin, colon - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = colon + 1;
  }
  throw Error("cannot find '" + name + "' on PATH");
}

class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // Runs argv (argv[0] a path, or a name found on PATH), stdout into `out_path` and stderr into
  // `err_path` (the same path: one file, in the order written).
  ChildProcess(std::vector<std::string> argv, const std::string& out_path,
               const std::string& err_path)
      : name_(argv.at(0)) {
    const std::string file = executable_path(name_);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    const bool same_file = out_path == err_path;
    pid_ = fork();
    PIPIT_CHECK(pid_ >= 0, "cannot fork for ", name_);
    if (pid_ == 0) {  // only async-signal-safe calls from here to exec
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
      const int err = same_file ? out : open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
      close_range(3, ~0U, 0);
      execv(file.c_str(), args.data());
      _exit(127);
    }
  }
  ~ChildProcess() { kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Whether the process has not exited yet (a stopped process is running); reaps it if it has.
  bool running() {
    if (status_) return false;
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == 0) return true;
    status_ = done == pid_ && WIFEXITED(status)     ? WEXITSTATUS(status)
              : done == pid_ && WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                                    : -1;
    return false;
  }
  // The exit code (128 + signal when killed by one); nothing while it runs.
  std::optional<int> exit_status() {
    running();
    return status_;
  }
  void signal(int sig) {
    if (running()) ::kill(pid_, sig);
  }
  // Waits until the process exits or `deadline` passes; whether it exited.
  bool wait_exit(Clock::time_point deadline) {
    while (running()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  // SIGKILL (it works on a stopped process too) and reap, waiting at most 10 s.
  void kill() {
    if (!running()) return;
    ::kill(pid_, SIGKILL);
    wait_exit(Clock::now() + std::chrono::seconds(10));
  }

 private:
  std::string name_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// What `process` wrote to `path` (atomically: a port file, say), once it is there. Throws,
// quoting the process's log at `log_path`, when the process exits first or `timeout` passes.
inline std::string wait_for_file(ChildProcess& process, const std::string& path,
                                 std::chrono::milliseconds timeout, const std::string& log_path) {
  const auto deadline = ChildProcess::Clock::now() + timeout;
  while (!std::filesystem::exists(path)) {
    const bool running = process.running();
    PIPIT_CHECK(running && ChildProcess::Clock::now() < deadline, process.name(),
                running ? " wrote no " : " exited before writing ", path, "; its log:\n",
                std::filesystem::exists(log_path) ? read_file(log_path) : std::string());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return read_file(path);
}

}  // namespace pipit::support
