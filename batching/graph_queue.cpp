#include "batching/graph_queue.h"

namespace pipit::batching {

void GraphQueue::push(BuiltGraph built) {
  PIPIT_CHECK(built.graph != nullptr, "GraphQueue: pushed no graph");
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return closed_ || queue_.size() < capacity_; });
  PIPIT_CHECK(!closed_, "GraphQueue: push after close()");
  queue_.push_back(std::move(built));
  changed_.notify_all();
}

std::vector<BuiltGraph> GraphQueue::pop_some(size_t most) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return closed_ || !queue_.empty(); });
  std::vector<BuiltGraph> taken;
  while (!queue_.empty() && taken.size() < most) {
    taken.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  changed_.notify_all();
  return taken;
}

void GraphQueue::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace pipit::batching
