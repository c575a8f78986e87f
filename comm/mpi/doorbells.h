#pragma once
// Doorbells: one futex word per rank in memory the ranks of a node share, so that an idle MPI
// progress thread can sleep instead of polling. MPI's shared-memory transport has nothing to
// block on: a receiver learns of a message only by polling, which on a machine whose cores
// the ranks share takes cores from the stages that compute. A rank that has posted a message
// to a rank of its node rings that rank's bell; the receiver's progress thread, idle, sleeps on
// its own bell until it changes.
//
// The protocol that keeps wake-ups from being lost: read your bell (seen()) before looking
// for work; sleep only with wait(that value), which returns at once if a ring came since.
// MPI may make a message visible a little after its send was posted, so a woken thread polls
// for a while before it sleeps again (MpiOptions::spin), and senders ring again when a send
// completes.
#include <chrono>
#include <cstdint>
#include <memory>

namespace pipit {

class NodeDoorbells {
 public:
  // Collective over MPI_COMM_WORLD; `ranks_here`: the ranks on this node (MpiJob's
  // local_size). Null when some rank of the job runs on another node (it could not ring this
  // one) or the shared memory cannot be made: the caller polls instead.
  static std::unique_ptr<NodeDoorbells> open(int rank, int world_size, int ranks_here);
  ~NodeDoorbells();
  NodeDoorbells(const NodeDoorbells&) = delete;
  NodeDoorbells& operator=(const NodeDoorbells&) = delete;

  void ring(int rank);
  uint32_t seen() const;  // this rank's bell
  // Sleeps until this rank's bell differs from `seen`, or for `timeout`. True if it rang.
  bool wait(uint32_t seen, std::chrono::microseconds timeout);

 private:
  struct Bell;
  NodeDoorbells(Bell* bells, size_t bytes, int rank) : bells_(bells), bytes_(bytes), rank_(rank) {}
  Bell* bells_;
  size_t bytes_;
  int rank_;
};

}  // namespace pipit
