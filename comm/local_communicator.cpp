#include "comm/local_communicator.h"

#include <string>

namespace pipit {

std::shared_ptr<Inbox> LocalHub::inbox(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = inboxes_[id];
  if (!slot) slot = std::make_shared<Inbox>("endpoint " + std::to_string(id));
  return slot;
}

std::shared_ptr<Communicator> LocalHub::endpoint(int id) {
  return std::make_shared<LocalCommunicator>(shared_from_this(), id);
}

void LocalCommunicator::send(int peer, Message message) {
  message.from = id_;
  hub_->inbox(peer)->push(std::move(message));
}

}  // namespace pipit
