#pragma once
// Inbox: a thread-safe queue of messages, the receiving half of every Communicator.
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
  explicit Inbox(std::string owner) : owner_(std::move(owner)) {}
  // Returns false (and drops the message) once the inbox is closed.
  bool push(Message message);
  // Blocks for the next message; throws ClosedError once closed and empty.
  Message pop();
  std::optional<Message> pop_for(std::chrono::milliseconds timeout);
  void close();

 private:
  Message take_front();

  std::string owner_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Message> messages_;
  bool closed_ = false;
};

}  // namespace pipit
