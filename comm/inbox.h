#pragma once
// Inbox: a thread-safe queue of messages, the receiving half of every Communicator.
//
// A receiver whose recent messages came quickly (a reply to a small request, the next of a
// burst) polls the queue for up to kPollBeforeSleep, yielding its core, before it sleeps:
// the message then costs the thread that delivers it no wake-up call, and the receiver none
// of a sleeper's wake-up latency. A receiver that had to wait longer than that the last time
// it waited sleeps at once, so an idle or slow pipeline stage spins no core.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "comm/message.h"

namespace pipit {

class Inbox {
 public:
  static constexpr std::chrono::microseconds kPollBeforeSleep{100};

  explicit Inbox(std::string owner) : owner_(std::move(owner)) {}
  // Returns false (and drops the message) once the inbox is closed.
  bool push(Message message);
  // Blocks for the next message; throws ClosedError once closed and empty.
  Message pop();
  std::optional<Message> pop_for(std::chrono::milliseconds timeout);
  void close();

 private:
  // Polls until `deadline` if the last wait was short; true once a message is queued or the
  // inbox closed.
  bool poll_until(std::chrono::steady_clock::time_point deadline);
  Message take_front();

  std::string owner_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Message> messages_;
  bool closed_ = false;
  std::atomic<bool> ready_to_take_{false};   // messages_ non-empty or closed_
  std::atomic<bool> last_wait_short_{true};  // the last pop that had to wait waited briefly
};

}  // namespace pipit
