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
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

#include "comm/message.h"

namespace pipit {

// A message whose decoding (parsing, checking its checksum) is left to the thread that takes
// it from the inbox, off the thread that received its bytes. take() is nullopt for a message
// that had to be dropped (the implementation says why).
class PendingMessage {
 public:
  virtual ~PendingMessage() = default;
  virtual std::optional<Message> take() = 0;
};

class Inbox {
 public:
  static constexpr std::chrono::microseconds kPollBeforeSleep{100};

  // `while_polling`: what a receiver does between looks at the queue while it polls (a
  // transport that moves messages on the receiver's thread); by default it yields its core.
  explicit Inbox(std::string owner, std::function<void()> while_polling = {})
      : owner_(std::move(owner)), while_polling_(std::move(while_polling)) {}
  // Returns false (and drops the message) once the inbox is closed.
  bool push(Message message);
  bool push(std::unique_ptr<PendingMessage> message);
  // Blocks for the next message; throws ClosedError once closed and empty.
  Message pop();
  std::optional<Message> pop_for(std::chrono::milliseconds timeout);
  void close();

 private:
  using Entry = std::variant<Message, std::unique_ptr<PendingMessage>>;
  // Polls until `deadline` if the last wait was short; true once a message is queued or the
  // inbox closed.
  bool poll_until(std::chrono::steady_clock::time_point deadline);
  bool push_entry(Entry entry);
  Entry take_front();
  // The message of an entry taken, decoded here if it was pending; nullopt if dropped.
  static std::optional<Message> open(Entry entry);
  // Waits until `deadline` (none: for ever).
  std::optional<Message> pop_until(std::optional<std::chrono::steady_clock::time_point> deadline);

  std::string owner_;
  std::function<void()> while_polling_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Entry> messages_;
  bool closed_ = false;
  std::atomic<bool> ready_to_take_{false};   // messages_ non-empty or closed_
  std::atomic<bool> last_wait_short_{true};  // the last pop that had to wait waited briefly
};

}  // namespace pipit
