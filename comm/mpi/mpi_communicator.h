#pragma once
// Messages over MPI (Open MPI), for jobs started by mpirun or srun. One MpiTransport per
// process owns MPI: it initialises it with MPI_THREAD_SERIALIZED, and its MPI calls (sends
// with MPI_Isend, receives with MPI_Improbe + MPI_Mrecv and MPI_Irecv, so no receiver
// guesses a size) are made under one lock by whichever thread holds it: a sending thread
// starts its own send when the lock is free, a thread polling its inbox for a message moves
// the rank's messages itself, and a progress thread moves them otherwise. So the message a
// thread waits for, and the one it sends, need no hand-off between threads. Each
// Communicator endpoint (a stage, the coordinator, a parameter-server shard or worker) lives
// on one rank, given by a route table every rank builds the same way; several endpoints may
// share a rank (the coordinator beside stage 0). A message travels as our frame (its
// headers checksummed, its tensors' bytes too with `checksum_tensor_bytes`) in two MPI messages, a
// head and the tensors' bytes, so neither side copies tensor bytes (comm/mpi/mpi_frames.h); the
// thread that takes it from its inbox checks and decodes it, off the thread that moves the next
// one. Between endpoints of one rank it is handed over without MPI. One frame to each rank at a
// time is in MPI's hands; later ones wait in the transport's queue, in order. The progress thread
// polls while receives are in flight and for `spin` after the last message moved; then, where every
// rank of the job is on this node, it sleeps until a rank rings its doorbell
// (comm/mpi/doorbells.h), and elsewhere it naps, up to `idle_sleep`; so an idle rank does not spin
// a core. A send queued while another thread held the lock wakes it at once. Sums of two
// endpoints (MpiOptions::pair_sums, Communicator::start_pair_sum) run as MPI_Iallreduce on a
// communicator of their two ranks, moved by the same lock holders.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_job.h"

namespace pipit {

struct MpiOptions {
  std::chrono::microseconds idle_sleep{200};  // the longest nap of an idle progress thread
  std::chrono::microseconds spin{100};        // polling, yielding the core, after traffic
  // Whether frames' checksums cover the tensors' bytes. MPI delivers bytes intact or fails
  // (as NCCL and Gloo assume), and checking every byte on both sides held a 1 MiB stream
  // between two ranks to 0.73-0.76 of raw MPI's rate (0.90-0.94 without); headers (route,
  // JSON, tensor layout) are always checked. A receiver checks what each frame says it
  // covers, so ranks may differ.
  bool checksum_tensor_bytes = false;
  // Pairs of endpoints whose sums (Communicator::start_pair_sum) run as MPI_Iallreduce on a
  // communicator of their two ranks, split off at start: every rank passes the same list, and
  // a rank holds at most one pair's endpoint. A pipeline with two replicas pairs each stage's.
  std::vector<std::pair<int, int>> pair_sums;
  // A Pipeline over MPI (Launch::mpi) with two replicas and pair_sums empty: pair each
  // stage's replicas. Off by
  // default: on a 2-core VM with 4 ranks it was at best even with the chain (bench/RESULTS.md,
  // replicas); where MPI's collectives are tuned to the network, try it.
  bool pair_replicas = false;
};

class MpiTransport : public std::enable_shared_from_this<MpiTransport> {
 public:
  // Initialises MPI (once per process) and starts the progress thread. `ranks[endpoint]`:
  // the rank each endpoint lives on. `fingerprint` (any text; empty: not checked) must be the
  // same on every rank: otherwise every rank throws an Error naming the ranks that differ
  // from rank 0 (SPMD programs that built different models or configs).
  static std::shared_ptr<MpiTransport> start(std::map<int, int> ranks, MpiOptions options = {},
                                             const std::string& fingerprint = "");
  ~MpiTransport();

  int rank() const;
  int world_size() const;
  // The rank's index among the ranks of its node (for choosing a GPU), from MPI's shared-
  // memory split.
  int local_rank() const;
  // How many pair sums (MpiOptions::pair_sums) this rank has finished.
  int64_t pair_sums() const;

  // The communicator of `endpoint`, which must live on this rank.
  std::shared_ptr<Communicator> endpoint(int endpoint);

  // Sends everything queued, waits in a barrier until every rank has (receiving meanwhile),
  // stops the progress thread and finalises MPI. Every rank must call it (or let the
  // transport go), as MPI_Finalize is collective.
  void stop();
  // Stops the progress thread without the barrier and without finalising MPI: for a rank
  // that failed, so that mpirun ends the job (non-zero, naming the rank) instead of every
  // rank waiting. The destructor does this when it runs while an exception unwinds.
  void abandon();

  struct Impl;

 private:
  explicit MpiTransport(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the communicators, which queue into it
};

}  // namespace pipit
