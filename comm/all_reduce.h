#pragma once
// All-reduce over any Communicator (in-process, TCP, MPI): each member's tensor replaced by the
// elementwise sum of all members', the same bits on every member and in every run, summed in
// the order member 0's + member 1's + ... + member r-1's (what a loop adding them one after
// another gives), so a data-parallel step can equal sequential accumulation bit for bit.
//
// The scheme is a pipelined chain: the tensor is cut into segments; segment s travels
// 0 -> 1 -> ... -> r-1, each member adding its own part to what arrived, and the last member's
// sum travels back r-1 -> 0 -> 1 -> ... -> r-2. Each link carries each segment about twice,
// as a ring's reduce-scatter plus all-gather would, and segments overlap along the chain.
//
// AllReduce is the state machine, fed messages by whoever owns the communicator (a pipeline
// stage mixes it with its other traffic); all_reduce drives one to the end on a communicator
// that carries nothing else meanwhile. A member may start before its whole tensor is final
// (a stage whose later layers' gradients are done while earlier ones still run): it says how
// many leading elements are ready, and segments beyond them wait, on every member, until
// make_ready covers them. The sums do not depend on when that happens.
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/message.h"

namespace pipit {

class AllReduce {
 public:
  // `members`: the group's endpoint ids in summation order; `me` must be one of them.
  // `tensor`: this member's contribution (contiguous), overwritten by the sum. `tag` tells
  // concurrent all-reduces apart (it is the messages' step). Segments hold at most
  // `segment_elements` elements.
  // `ready_elements`: how many leading elements of this member's tensor are final (-1: all).
  AllReduce(std::vector<int> members, int me, Tensor tensor, int64_t tag,
            int64_t segment_elements = int64_t{1} << 20, int64_t ready_elements = -1);

  using Outgoing = std::vector<std::pair<int, Message>>;  // (peer, message)
  // The messages to send first.
  Outgoing start();
  // The first `elements` elements of this member's tensor are final now (never fewer than
  // before): the messages that they let go.
  Outgoing make_ready(int64_t elements);
  // Takes one AllReduceSegment message of this tag; returns the messages to send next. A
  // message from the wrong member, for a segment out of range or already taken, or of the
  // wrong shape or dtype throws an Error naming it.
  Outgoing receive(const Message& message);
  bool done() const { return remaining_ == 0; }
  int64_t tag() const { return tag_; }

 private:
  Tensor segment(int64_t s) const;
  // Whether segment s lies within the ready elements.
  bool ready(int64_t s) const;
  Message make(int phase, int64_t s, Tensor data) const;
  // A checked reduce-phase segment whose own part is ready: added and passed on.
  void reduce(int64_t s, const Tensor& received, Outgoing& out);

  std::vector<int> members_;
  size_t index_ = 0;  // my place in members_
  Tensor flat_;
  int64_t tag_, segment_elements_, segments_;
  int64_t ready_elements_;
  int64_t sent_ = 0;  // member 0: segments sent so far (a prefix)
  int64_t remaining_;
  std::vector<bool> taken_[2];                       // per phase, per segment
  std::vector<std::pair<int64_t, Tensor>> waiting_;  // received before their part was ready
};

// Runs an AllReduce over `comm` until it is done. Waits at most `timeout` for each message;
// a member that stays silent longer throws an Error naming it.
void all_reduce(Communicator& comm, const std::vector<int>& members, const Tensor& tensor,
                int64_t tag = 0, int64_t segment_elements = int64_t{1} << 20,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

}  // namespace pipit
