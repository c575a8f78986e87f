#pragma once
// One rank's side of a pair sum (MpiOptions::pair_sums, Communicator::start_pair_sum): the
// sum of a tensor with the same-named tensor of the pair's other endpoint, as MPI_Iallreduce
// on the pair's own communicator. Each side tells the other, in a notice on that
// communicator, the name (step, part) of each sum it starts, and starts the collective only
// once both have named it: a sum one side skipped (an aborted step) is never matched with the
// next, as collectives match by order. Only a thread that holds the transport's MPI lock calls
// move(), in_flight() and release().
#include <mpi.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/message.h"
#include "comm/mpi/doorbells.h"
#include "tensor/tensor.h"

namespace pipit {

class MpiPairSum {
 public:
  struct Sum {
    int64_t step = 0;
    int part = 0;
    Tensor tensor;
    bool operator<(const Sum& other) const {
      return std::pair(step, part) < std::pair(other.step, other.part);
    }
  };

  // Collective over MPI_COMM_WORLD (every rank calls it); null on a rank in no pair.
  static std::unique_ptr<MpiPairSum> open(const std::vector<std::pair<int, int>>& pairs,
                                          const std::map<int, int>& ranks, int rank);

  int endpoint() const { return endpoint_; }
  int peer() const { return peer_; }
  // Checks that `sum` is named after the last one this endpoint started (the pair's order).
  void check_order(const Sum& sum);
  // Names `queued` to the peer, takes the peer's notices, starts the sums both named and
  // retires those done, each as a PairSumDone message to `finished`; true when one started
  // or finished.
  bool move(std::deque<Sum> queued, NodeDoorbells* doorbells,
            const std::function<void(Message)>& finished);
  bool in_flight() const { return !summing_.empty() || !notices_.empty(); }
  int64_t done() const { return done_; }
  // Frees the pair's communicator, before MPI_Finalize.
  void release() { MPI_Comm_free(&comm_); }

 private:
  MpiPairSum(int endpoint, int peer, int peer_rank, int pair_rank, MPI_Comm comm)
      : endpoint_(endpoint),
        peer_(peer),
        peer_rank_(peer_rank),
        pair_rank_(pair_rank),
        comm_(comm) {}
  void name_to_peer(std::deque<Sum> queued, NodeDoorbells* doorbells);
  bool take_notices();
  bool start_matched();
  void start(Sum sum);

  // A bucket goes as collectives of this many elements, all started at once (the chain's
  // segment size), so that one segment's additions overlap the next one's transfer.
  static constexpr int64_t kSegment = int64_t{1} << 20;
  static constexpr int kNoticeTag = 9;

  int endpoint_, peer_;  // this rank's endpoint and the other's
  int peer_rank_;
  int pair_rank_;  // this rank's place in `comm_`: 0 or 1
  MPI_Comm comm_;
  std::deque<Sum> mine_;    // named to the peer, not yet matched
  std::deque<Sum> theirs_;  // named by the peer, not yet matched (no tensor)
  std::list<std::pair<std::array<int64_t, 2>, MPI_Request>> notices_;  // being sent
  std::list<std::pair<Sum, std::vector<MPI_Request>>> summing_;
  std::pair<int64_t, int> last_{-1, 0};  // the last name started (order check)
  std::atomic<int64_t> done_{0};
};

}  // namespace pipit
