#pragma once
// DirWatch: a thread that calls `on_event(name, mask)` for every file created in, or renamed
// into, one directory (inotify IN_CREATE | IN_MOVED_TO). The chaos driver uses it to stop or
// kill the coordinator the moment it creates a checkpoint's temporary file, and to keep a
// hard link to every checkpoint the reference run writes.
#include <atomic>
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "tensor/error.h"

namespace pipit::chaos {

class DirWatch {
 public:
  using Handler = std::function<void(const std::string& name, uint32_t mask)>;

  DirWatch(const std::string& dir, Handler on_event) : on_event_(std::move(on_event)) {
    fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    PIPIT_CHECK(fd_ >= 0, "chaos: inotify_init1: ", std::strerror(errno));
    PIPIT_CHECK(inotify_add_watch(fd_, dir.c_str(), IN_CREATE | IN_MOVED_TO) >= 0,
                "chaos: cannot watch '", dir, "': ", std::strerror(errno));
    thread_ = std::thread([this] { loop(); });
  }
  ~DirWatch() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

 private:
  void loop() {
    alignas(inotify_event) char buffer[16 * (sizeof(inotify_event) + NAME_MAX + 1)];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = read(fd_, buffer, sizeof buffer);
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        if (event->len > 0) on_event_(event->name, event->mask);
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  }

  Handler on_event_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pipit::chaos
