#include "comm/inbox.h"

#include <thread>

#include "comm/communicator.h"

namespace pipit {

using Clock = std::chrono::steady_clock;

bool Inbox::push(Message message) {
  return push_entry(std::move(message));
}

bool Inbox::push(std::unique_ptr<PendingMessage> message) {
  return push_entry(std::move(message));
}

bool Inbox::push_entry(Entry entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    messages_.push_back(std::move(entry));
    ready_to_take_.store(true, std::memory_order_release);
  }
  ready_.notify_one();
  return true;
}

Inbox::Entry Inbox::take_front() {
  if (messages_.empty()) throw ClosedError("receive: " + owner_ + " is closed");
  Entry entry = std::move(messages_.front());
  messages_.pop_front();
  ready_to_take_.store(!messages_.empty() || closed_, std::memory_order_relaxed);
  return entry;
}

std::optional<Message> Inbox::open(Entry entry) {
  if (auto* message = std::get_if<Message>(&entry)) return std::move(*message);
  return std::get<std::unique_ptr<PendingMessage>>(entry)->take();
}

bool Inbox::poll_until(Clock::time_point deadline) {
  if (!last_wait_short_.load(std::memory_order_relaxed)) return false;
  while (Clock::now() < deadline) {
    if (while_polling_) {
      while_polling_();
    } else {
      std::this_thread::yield();
    }
    if (ready_to_take_.load(std::memory_order_acquire)) return true;
  }
  return false;
}

std::optional<Message> Inbox::pop_until(std::optional<Clock::time_point> deadline) {
  while (true) {
    const auto start = Clock::now();
    const auto poll_deadline =
        deadline ? std::min(*deadline, start + kPollBeforeSleep) : start + kPollBeforeSleep;
    const bool polled = ready_to_take_.load(std::memory_order_acquire) || poll_until(poll_deadline);
    std::unique_lock<std::mutex> lock(mutex_);
    if (!polled) {
      const auto ready = [&] { return !messages_.empty() || closed_; };
      if (!deadline) {
        ready_.wait(lock, ready);
      } else if (!ready_.wait_until(lock, *deadline, ready)) {
        if (*deadline - start >= kPollBeforeSleep) last_wait_short_ = false;
        return std::nullopt;
      }
      last_wait_short_ = Clock::now() - start < kPollBeforeSleep;
    }
    Entry entry = take_front();
    lock.unlock();
    // Decoded outside the lock, so the thread that delivers the next message need not wait.
    if (auto message = open(std::move(entry))) return message;
  }
}

Message Inbox::pop() {
  return *pop_until(std::nullopt);
}

std::optional<Message> Inbox::pop_for(std::chrono::milliseconds timeout) {
  return pop_until(Clock::now() + timeout);
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
