#include "comm/mpi/mpi_pair_sum.h"

#include <algorithm>
#include <cstdio>

#include "comm/mpi/mpi_frames.h"

namespace pipit {

std::unique_ptr<MpiPairSum> MpiPairSum::open(const std::vector<std::pair<int, int>>& pairs,
                                             const std::map<int, int>& ranks, int rank) {
  std::map<int, std::pair<int, int>> pair_of_rank;  // rank -> (pair, endpoint)
  int color = MPI_UNDEFINED;
  int endpoint = -1, peer = -1;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [a, b] = pairs[i];
    for (int e : {a, b}) {
      const auto at = ranks.find(e);
      PIPIT_CHECK(at != ranks.end(), "MPI: pair_sums names endpoint ", e,
                  ", which has no rank in the route table");
      const auto [other, taken] = pair_of_rank.try_emplace(at->second, static_cast<int>(i), e);
      PIPIT_CHECK(taken, "MPI: rank ", at->second, " holds endpoint ", e, " of pair ", i,
                  " and endpoint ", other->second.second, " of pair ", other->second.first,
                  ": pair_sums takes at most one pair per rank, on two ranks");
    }
    if (ranks.at(a) == rank || ranks.at(b) == rank) {
      color = static_cast<int>(i);
      endpoint = ranks.at(a) == rank ? a : b;
      peer = endpoint == a ? b : a;
    }
  }
  MPI_Comm comm = MPI_COMM_NULL;
  // Key: the rank, so a pair's lower rank is its rank 0.
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &comm), "MPI_Comm_split");
  if (color == MPI_UNDEFINED) return nullptr;
  const int peer_rank = ranks.at(peer);
  return std::unique_ptr<MpiPairSum>(
      new MpiPairSum(endpoint, peer, peer_rank, rank < peer_rank ? 0 : 1, comm));
}

void MpiPairSum::check_order(const Sum& sum) {
  const std::pair<int64_t, int> name{sum.step, sum.part};
  PIPIT_CHECK(last_ < name, "MPI: endpoint ", endpoint_, " started pair sum (", sum.step, ", ",
              sum.part, ") after (", last_.first, ", ", last_.second,
              "): a pair's sums are named in increasing order");
  last_ = name;
}

bool MpiPairSum::move(std::deque<Sum> queued, NodeDoorbells* doorbells,
                      const std::function<void(Message)>& finished) {
  name_to_peer(std::move(queued), doorbells);
  bool moved = take_notices();
  moved = start_matched() || moved;
  std::erase_if(summing_, [&](auto& sum) {
    int complete = 0;
    check_mpi(MPI_Testall(static_cast<int>(sum.second.size()), sum.second.data(), &complete,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (!complete) return false;
    Message message(MessageKind::PairSumDone, sum.first.step, sum.first.part);
    message.from = endpoint_;
    finished(std::move(message));
    ++done_;
    moved = true;
    return true;
  });
  return moved;
}

void MpiPairSum::name_to_peer(std::deque<Sum> queued, NodeDoorbells* doorbells) {
  for (Sum& sum : queued) {
    auto& notice =
        notices_.emplace_back(std::array<int64_t, 2>{sum.step, sum.part}, MPI_REQUEST_NULL);
    check_mpi(MPI_Isend(notice.first.data(), 2, MPI_INT64_T, 1 - pair_rank_, kNoticeTag, comm_,
                        &notice.second),
              "MPI_Isend");
    if (doorbells) doorbells->ring(peer_rank_);
    mine_.push_back(std::move(sum));
  }
  std::erase_if(notices_, [](auto& notice) {
    int sent = 0;
    check_mpi(MPI_Test(&notice.second, &sent, MPI_STATUS_IGNORE), "MPI_Test");
    return sent != 0;
  });
}

bool MpiPairSum::take_notices() {
  bool moved = false;
  while (true) {
    int found = 0;
    MPI_Message handle;
    MPI_Status status;
    check_mpi(MPI_Improbe(1 - pair_rank_, kNoticeTag, comm_, &found, &handle, &status),
              "MPI_Improbe");
    if (!found) return moved;
    int count = 0;
    check_mpi(MPI_Get_count(&status, MPI_INT64_T, &count), "MPI_Get_count");
    std::array<int64_t, 2> name{};
    if (count != 2) {
      check_mpi(MPI_Mrecv(nullptr, 0, MPI_BYTE, &handle, MPI_STATUS_IGNORE), "MPI_Mrecv");
      std::fprintf(stderr, "[mpi] endpoint %d dropped a pair-sum notice of %d values, expected 2\n",
                   endpoint_, count);
      continue;
    }
    check_mpi(MPI_Mrecv(name.data(), 2, MPI_INT64_T, &handle, MPI_STATUS_IGNORE), "MPI_Mrecv");
    theirs_.push_back(Sum{name[0], static_cast<int>(name[1]), Tensor()});
    moved = true;
  }
}

// Both sides name their sums in increasing order, so a name one side passed is one the other
// skipped.
bool MpiPairSum::start_matched() {
  bool started = false;
  while (!mine_.empty() && !theirs_.empty()) {
    if (mine_.front() < theirs_.front()) {
      mine_.pop_front();
    } else if (theirs_.front() < mine_.front()) {
      theirs_.pop_front();
    } else {
      start(std::move(mine_.front()));
      mine_.pop_front();
      theirs_.pop_front();
      started = true;
    }
  }
  return started;
}

void MpiPairSum::start(Sum sum) {
  auto& started = summing_.emplace_back(std::move(sum), std::vector<MPI_Request>());
  const Tensor& t = started.first.tensor;
  const int64_t n = t.numel();
  for (int64_t at = 0; at < n; at += kSegment) {
    MPI_Request& request = started.second.emplace_back(MPI_REQUEST_NULL);
    const int count = static_cast<int>(std::min(kSegment, n - at));
    void* data =
        static_cast<char*>(t.raw_data()) + at * static_cast<int64_t>(dtype_size(t.dtype()));
    check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, data, count, t.dtype() == DType::f64 ? MPI_DOUBLE : MPI_FLOAT,
                       MPI_SUM, comm_, &request),
        "MPI_Iallreduce");
  }
}

}  // namespace pipit
