#pragma once
// In-process communication: every endpoint has an Inbox in a shared LocalHub, and a message's
// tensors are handed over as they are, without copies.
#include <map>
#include <memory>
#include <mutex>

#include "comm/communicator.h"
#include "comm/inbox.h"

namespace pipit {

class LocalHub : public std::enable_shared_from_this<LocalHub> {
 public:
  static std::shared_ptr<LocalHub> create() { return std::shared_ptr<LocalHub>(new LocalHub()); }
  // A communicator for endpoint `id`; all communicators of one id share its inbox.
  std::shared_ptr<Communicator> endpoint(int id);
  std::shared_ptr<Inbox> inbox(int id);

 private:
  LocalHub() = default;
  std::mutex mutex_;
  std::map<int, std::shared_ptr<Inbox>> inboxes_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalHub> hub, int id)
      : hub_(std::move(hub)), id_(id), inbox_(hub_->inbox(id)) {}
  int id() const override { return id_; }
  void send(int peer, Message message) override;
  Message receive() override { return inbox_->pop(); }
  std::optional<Message> try_receive(std::chrono::milliseconds timeout) override {
    return inbox_->pop_for(timeout);
  }
  void close() override { inbox_->close(); }
  bool carries_device_tensors() const override { return true; }

 private:
  std::shared_ptr<LocalHub> hub_;
  int id_;
  std::shared_ptr<Inbox> inbox_;
};

}  // namespace pipit
