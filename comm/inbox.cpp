#include "comm/inbox.h"

#include <thread>

#include "comm/communicator.h"

namespace pipit {

bool Inbox::push(Message message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    messages_.push_back(std::move(message));
    takeable_.store(true, std::memory_order_release);
  }
  ready_.notify_one();
  return true;
}

Message Inbox::take_front() {
  if (messages_.empty()) throw ClosedError("receive: " + owner_ + " is closed");
  Message message = std::move(messages_.front());
  messages_.pop_front();
  takeable_.store(!messages_.empty() || closed_, std::memory_order_release);
  return message;
}

// A message is often a few microseconds away (the reply to one just sent, the next
// microbatch): the receiver checks, yielding its core, for kSpin before it sleeps, which spares
// the pusher a wake-up of a sleeping thread.
void Inbox::spin_for_message() {
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    if (takeable_.load(std::memory_order_acquire)) return;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
}

Message Inbox::pop() {
  spin_for_message();
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return !messages_.empty() || closed_; });
  return take_front();
}

std::optional<Message> Inbox::pop_for(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) spin_for_message();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !messages_.empty() || closed_; })) {
    return std::nullopt;
  }
  return take_front();
}

void Inbox::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    takeable_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}

}  // namespace pipit
