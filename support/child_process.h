#pragma once
// Child: a process the chaos driver started, its stdout and stderr in files (or one file). It
// cannot outlive the driver: it gets SIGKILL when the thread that started it ends
// (PR_SET_PDEATHSIG), and the object kills it when it goes. It inherits no descriptor but its
// output files (a socket of the driver's proxy held open by a worker would hide a closed connection
// from its peer).
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tensor/error.h"

namespace pipit::chaos {

using Clock = std::chrono::steady_clock;

class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& out_path, const std::string& err_path)
      : name_(argv.at(0)) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    const bool same_file = out_path == err_path;
    pid_ = fork();
    PIPIT_CHECK(pid_ >= 0, "chaos: cannot fork for ", name_);
    if (pid_ == 0) {  // only async-signal-safe calls from here to exec
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
      const int err = same_file ? out : open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
      close_range(3, ~0U, 0);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Child() { kill(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

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

}  // namespace pipit::chaos
