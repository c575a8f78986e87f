#include "comm/inbox.h"

#include "comm/communicator.h"

namespace pipit {

bool Inbox::push(Message message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    messages_.push_back(std::move(message));
  }
  ready_.notify_one();
  return true;
}

Message Inbox::take_front() {
  if (messages_.empty()) throw ClosedError("receive: " + owner_ + " is closed");
  Message message = std::move(messages_.front());
  messages_.pop_front();
  return message;
}

Message Inbox::pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return !messages_.empty() || closed_; });
  return take_front();
}

std::optional<Message> Inbox::pop_for(std::chrono::milliseconds timeout) {
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
  }
  ready_.notify_all();
}

}  // namespace pipit
