#pragma once
// Communicator: how a coordinator or a stage talks to the others. Endpoints are numbered:
// stage s is endpoint s and the coordinator is kCoordinator. Stages and the Coordinator know
// only this interface; in-process and TCP implementations differ in how bytes move.
#include <chrono>
#include <optional>

#include "comm/message.h"

namespace pipit {

constexpr int kCoordinator = -1;

// Thrown by receive() once the communicator is closed and its inbox is empty.
class ClosedError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int id() const = 0;
  // Queues `message` for `peer` and returns; messages to one peer arrive in sending order.
  virtual void send(int peer, Message message) = 0;
  // Blocks until a message arrives.
  virtual Message receive() = 0;
  // Waits at most `timeout`; nothing when none arrived in time.
  virtual std::optional<Message> try_receive(std::chrono::milliseconds timeout) = 0;
  // Wakes a blocked receive(), which then throws ClosedError; later sends are dropped.
  virtual void close() = 0;
  // Whether a message's tensors may stay on a GPU: true in one process, false over a wire,
  // which carries host memory only (the sender copies to the CPU first).
  virtual bool carries_device_tensors() const { return false; }
};

}  // namespace pipit
