#pragma once
// ForwardingCommunicator: a communicator that hands every call to the one it wraps, for the
// test links that change one part of a communicator (what arrives, when it leaves) and keep
// the rest; they override only that part.
#include <chrono>
#include <memory>
#include <optional>

#include "comm/communicator.h"

namespace pipit::testing {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int id() const override { return inner_->id(); }
  void send(int peer, Message message) override { inner_->send(peer, std::move(message)); }
  Message receive() override { return inner_->receive(); }
  std::optional<Message> try_receive(std::chrono::milliseconds timeout) override {
    return inner_->try_receive(timeout);
  }
  void close() override { inner_->close(); }

 protected:
  Communicator& inner() { return *inner_; }

 private:
  std::shared_ptr<Communicator> inner_;
};

}  // namespace pipit::testing
