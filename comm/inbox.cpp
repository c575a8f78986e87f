#include "comm/inbox.h"

#include <thread>

#include "comm/communicator.h"

namespace pipit {

using Clock = std::chrono::steady_clock;

bool Inbox::push(Message message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    messages_.push_back(std::move(message));
    ready_to_take_.store(true, std::memory_order_release);
  }
  ready_.notify_one();
  return true;
}

Message Inbox::take_front() {
  if (messages_.empty()) throw ClosedError("receive: " + owner_ + " is closed");
  Message message = std::move(messages_.front());
  messages_.pop_front();
  ready_to_take_.store(!messages_.empty() || closed_, std::memory_order_relaxed);
  return message;
}

bool Inbox::poll_until(Clock::time_point deadline) {
  if (!last_wait_short_.load(std::memory_order_relaxed)) return false;
  while (Clock::now() < deadline) {
    std::this_thread::yield();
    if (ready_to_take_.load(std::memory_order_acquire)) return true;
  }
  return false;
}

Message Inbox::pop() {
  const auto start = Clock::now();
  if (!ready_to_take_.load(std::memory_order_acquire) && !poll_until(start + kPollBeforeSleep)) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !messages_.empty() || closed_; });
    last_wait_short_ = Clock::now() - start < kPollBeforeSleep;
    return take_front();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return take_front();
}

std::optional<Message> Inbox::pop_for(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  if (!ready_to_take_.load(std::memory_order_acquire) &&
      !poll_until(start + std::min<Clock::duration>(timeout, kPollBeforeSleep))) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_until(lock, start + timeout, [&] { return !messages_.empty() || closed_; })) {
      if (timeout >= kPollBeforeSleep) last_wait_short_ = false;
      return std::nullopt;
    }
    last_wait_short_ = Clock::now() - start < kPollBeforeSleep;
    return take_front();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return take_front();
}

void Inbox::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    ready_to_take_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}

}  // namespace pipit
