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

  // Sums of two members done by the transport's own collective (MPI_Iallreduce), for
  // comm/all_reduce.h's groups of two, whose bits are AllReduce's there: each element is one
  // addition, and a + b == b + a. Whether this endpoint sums `dtype` tensors with `peer` so
  // (the same answer on both sides; false: run AllReduce).
  virtual bool has_pair_sum(int /*peer*/, DType /*dtype*/) const { return false; }
  // Starts summing `tensor` (contiguous, on the CPU, kept until the sum is in) with the
  // same-sized tensor `peer` starts under the same name (`step`, `part`). When it is in
  // `tensor`, a PairSumDone message of that step and part (microbatch) arrives in this
  // endpoint's inbox. Each side names its sums in increasing order; a sum the peer skips (its
  // step was aborted) is dropped on both sides, never matched with another.
  virtual void start_pair_sum(int peer, const Tensor& /*tensor*/, int64_t /*step*/, int /*part*/) {
    throw Error("endpoint " + std::to_string(id()) + " has no pair sum with endpoint " +
                std::to_string(peer));
  }
};

}  // namespace pipit
