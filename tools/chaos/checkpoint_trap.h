#pragma once
// CheckpointTrap: sends a signal to the trainer the moment it creates a file in the checkpoint
// directory other than the checkpoint itself (the temporary a checkpoint is written to before
// its rename), from the inotify thread, so that SIGKILL or SIGSTOP lands while the write is
// under way. Whether it really did shows afterwards: the temporary is still there.
#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <string>

#include "tools/chaos/checkpoint_dir.h"
#include "tools/chaos/dir_watch.h"

namespace pipit::chaos {

using Clock = std::chrono::steady_clock;

class CheckpointTrap {
 public:
  struct Sprung {
    Clock::time_point when;
    std::string file;
  };

  explicit CheckpointTrap(const std::string& dir)
      : watch_(dir, [this](const std::string& name, uint32_t mask) { on_event(name, mask); }) {}

  void arm(pid_t pid, int signal) {
    std::lock_guard<std::mutex> lock(mutex_);
    pid_ = pid, signal_ = signal;
    sprung_.reset();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    pid_ = -1;
  }
  std::optional<Sprung> sprung() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sprung_;
  }

 private:
  void on_event(const std::string& name, uint32_t mask) {
    if (!(mask & IN_CREATE) || name == CheckpointDir::kFile || name == CheckpointDir::kFiller) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (pid_ <= 0) return;
    kill(pid_, signal_);
    sprung_ = Sprung{Clock::now(), name};
    pid_ = -1;
  }

  std::mutex mutex_;
  pid_t pid_ = -1;
  int signal_ = SIGKILL;
  std::optional<Sprung> sprung_;
  DirWatch watch_;  // last: its thread stops before the members it uses go
};

}  // namespace pipit::chaos
