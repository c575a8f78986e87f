#pragma once
// DelayedCommunicator: a slow network link for tests, where the kernel has no netem qdisc
// to delay packets. Each message leaves when its link (one per destination) has finished
// the messages before it at `bytes_per_second`, and arrives `latency` later, as on a wire;
// messages to one peer keep their order. Receiving is the wrapped communicator's.
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "forwarding_communicator.h"

namespace pipit::testing {

class DelayedCommunicator final : public ForwardingCommunicator {
 public:
  using Clock = std::chrono::steady_clock;

  DelayedCommunicator(std::shared_ptr<Communicator> inner, std::chrono::microseconds latency,
                      double bytes_per_second)
      : ForwardingCommunicator(std::move(inner)),
        latency_(latency),
        bytes_per_second_(bytes_per_second) {
    courier_ = std::thread([this] { deliver(); });
  }
  // Delivers what is still on the wire, then stops.
  ~DelayedCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    courier_.join();
  }

  void send(int peer, Message message) override {
    size_t bytes = 64;  // a frame's header, roughly
    for (const Tensor& t : message.tensors) bytes += t.nbytes();
    const auto wire_time = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_second_));
    std::lock_guard<std::mutex> lock(mutex_);
    Clock::time_point& free_at = link_free_at_[peer];
    free_at = std::max(free_at, Clock::now()) + wire_time;
    in_flight_.push({free_at + latency_, sequence_++, peer, std::move(message)});
    wake_.notify_all();
  }

 private:
  struct InFlight {
    Clock::time_point arrives;
    uint64_t sequence;  // breaks ties in sending order
    int peer;
    Message message;
    bool operator>(const InFlight& other) const {
      return arrives != other.arrives ? arrives > other.arrives : sequence > other.sequence;
    }
  };

  void deliver() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      if (in_flight_.empty()) {
        if (stopping_) return;
        wake_.wait(lock);
        continue;
      }
      const Clock::time_point due = in_flight_.top().arrives;
      if (Clock::now() < due && !stopping_) {
        wake_.wait_until(lock, due);
        continue;
      }
      InFlight next = std::move(const_cast<InFlight&>(in_flight_.top()));
      in_flight_.pop();
      lock.unlock();
      inner().send(next.peer, std::move(next.message));
      lock.lock();
    }
  }

  const std::chrono::microseconds latency_;
  const double bytes_per_second_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<int, Clock::time_point> link_free_at_;
  std::priority_queue<InFlight, std::vector<InFlight>, std::greater<>> in_flight_;
  uint64_t sequence_ = 0;
  bool stopping_ = false;
  std::thread courier_;
};

}  // namespace pipit::testing
