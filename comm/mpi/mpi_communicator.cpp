#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>
#include <sys/prctl.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/frame.h"
#include "comm/inbox.h"
#include "comm/mpi/doorbells.h"
#include "comm/mpi/mpi_frames.h"
#include "comm/mpi/mpi_pair_sum.h"
#include "comm/sha256.h"

namespace pipit {

struct MpiTransport::Impl {
  std::map<int, int> ranks;
  MpiOptions options;
  int rank = 0, world = 1, local_rank = 0;
  std::map<int, std::shared_ptr<Inbox>> inboxes;  // this rank's endpoints

  std::mutex mutex;
  std::condition_variable wake;                      // a send was queued
  std::map<int, std::list<OutgoingFrame>> outgoing;  // not started yet, by destination rank
  std::atomic<bool> stopping{false};
  std::atomic<bool> abandoning{false};  // leave at once: this rank failed
  std::thread progress;
  std::unique_ptr<NodeDoorbells> doorbells;  // null: the progress thread naps and polls
  // With doorbells every rank that could send to this one rings it: a safety net only.
  static constexpr std::chrono::milliseconds kLongestSleep{1};
  // A send in flight also sleeps, as its receiver rings when it has taken the message; but
  // an MPI transport that needs the sender's help to move the bytes gets it this often.
  static constexpr std::chrono::microseconds kLongestSleepWhileSending{200};

  // Wakes the progress thread for a send queued here, or to stop.
  void wake_progress() {
    if (doorbells) {
      doorbells->ring(rank);
    } else {
      wake.notify_one();
    }
  }

  static constexpr uint64_t kBodyBytesInFlight = uint64_t{64} << 20;  // per source rank
  // Frames from each rank in the order their heads arrived, delivered in that order.
  std::map<int, std::deque<IncomingFrame>> incoming;

  // A frame is decoded (checksum, headers) by the thread that takes it from its inbox,
  // so the progress thread goes on moving the next frame meanwhile.
  class FrameToDecode final : public PendingMessage {
   public:
    FrameToDecode(IncomingFrame frame, int rank) : frame_(std::move(frame)), rank_(rank) {}
    std::optional<Message> take() override {
      try {
        return std::move(frame_).message();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[mpi %d] dropped a message: %s\n", rank_, e.what());
        return std::nullopt;
      }
    }

   private:
    IncomingFrame frame_;
    int rank_;
  };

  void deliver(IncomingFrame frame) {
    auto inbox = inboxes.find(frame.destination());
    if (inbox != inboxes.end()) {
      inbox->second->push(std::make_unique<FrameToDecode>(std::move(frame), rank));
      return;
    }
    // Malformed (its route unreadable), or for an endpoint elsewhere: said now.
    const int destination = frame.destination();
    if (FrameToDecode(std::move(frame), rank).take()) {
      std::fprintf(stderr,
                   "[mpi %d] dropped a message for endpoint %d, which is not on this rank\n", rank,
                   destination);
    }
  }

  // Bodies start in order, and only so many bytes at once: a rank that sent many frames
  // ahead would otherwise have all their tensors allocated before the first is taken.
  static void start_bodies(std::deque<IncomingFrame>& frames) {
    uint64_t in_flight = 0;
    for (IncomingFrame& frame : frames) {
      if (!frame.started()) {
        if (in_flight > 0 && in_flight + frame.body_bytes() > kBodyBytesInFlight) return;
        frame.start();
      }
      in_flight += frame.body_bytes();
    }
  }

  // True when anything moved.
  bool receive() {
    bool moved = false;
    while (true) {
      int found = 0;
      MPI_Message handle;
      MPI_Status status;
      check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kHeadTag, MPI_COMM_WORLD, &found, &handle, &status),
                "MPI_Improbe");
      if (!found) break;
      int count = 0;
      check_mpi(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
      // Not zero-filled: MPI_Mrecv writes every byte.
      std::unique_ptr<char[]> head(new char[static_cast<size_t>(count)]);
      check_mpi(MPI_Mrecv(head.get(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE), "MPI_Mrecv");
      incoming[status.MPI_SOURCE].emplace_back(status.MPI_SOURCE, std::move(head),
                                               static_cast<size_t>(count));
      // The sender's request may wait for this receive (MPI's rendezvous).
      if (doorbells) doorbells->ring(status.MPI_SOURCE);
      moved = true;
    }
    for (auto& [source, frames] : incoming) {
      while (true) {
        start_bodies(frames);
        if (frames.empty() || !frames.front().done()) break;
        if (doorbells && frames.front().body_bytes() > 0) doorbells->ring(source);
        deliver(std::move(frames.front()));
        frames.pop_front();
        moved = true;
      }
    }
    return moved;
  }

  // Guards every MPI call and what the calls use (`sending`, `in_flight`, `incoming`,
  // `barrier`): the progress thread takes it for each pass, and so does a thread that waits
  // in receive() or sends, when it is free, so that a message needs no hand-off between
  // threads.
  std::mutex mpi;
  std::list<OutgoingFrame> sending;  // a list: MPI holds their buffers' addresses
  MPI_Request barrier = MPI_REQUEST_NULL;

  // At most this many frames to one rank are started and not done; later ones wait in
  // `outgoing`. Open MPI keeps a large send it cannot start at once on a pending list that
  // every progress call retries: a sender that had queued hundreds of 1 MiB frames spent a
  // third of the node's CPU there. One at a time moved a 4 MiB stream at 0.81-0.83 of raw
  // MPI's rate, two 0.62-0.78, four 0.65-0.74, all 0.54-0.59; the GPT step did not change.
  static constexpr size_t kFramesInFlight = 1;
  std::map<int, size_t> in_flight;  // by destination rank

  // Retires the sends that are done, then starts the queued sends each rank has room for, in
  // the order they were queued; true when one started. Needs `mpi`.
  bool send_queued() {
    std::erase_if(sending, [this](OutgoingFrame& frame) {
      if (!frame.done()) return false;
      --in_flight[frame.rank()];
      // Again: MPI may have made the message visible only after the start's ring.
      if (doorbells) doorbells->ring(frame.rank());
      return true;
    });
    std::list<OutgoingFrame> batch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto queue = outgoing.begin(); queue != outgoing.end();) {
        auto& [rank, frames] = *queue;
        const size_t room = kFramesInFlight - std::min(in_flight[rank], kFramesInFlight);
        auto last = frames.begin();
        std::advance(last, std::min(room, frames.size()));
        batch.splice(batch.end(), frames, frames.begin(), last);
        queue = frames.empty() ? outgoing.erase(queue) : std::next(queue);
      }
    }
    for (OutgoingFrame& frame : batch) {
      frame.start();
      ++in_flight[frame.rank()];
      if (doorbells) doorbells->ring(frame.rank());
    }
    const bool started = !batch.empty();
    sending.splice(sending.end(), batch);
    return started;
  }

  // After a pass: whether a thread moving messages must poll again rather than sleep (a body
  // is being received, which moves only while a thread calls into MPI; the final barrier;
  // a send in flight, where no receiver will ring), and the longest it may sleep otherwise
  // (a rendezvous send's receiver rings when it took the message, but an MPI transport that
  // needs the sender's help to move the bytes gets it this often). Needs `mpi`.
  bool must_poll() const {
    return receiving() || barrier != MPI_REQUEST_NULL || (!sending.empty() && !doorbells) ||
           pair_sums_in_flight();
  }
  bool receiving() const {
    return std::any_of(incoming.begin(), incoming.end(),
                       [](const auto& source) { return !source.second.empty(); });
  }
  std::chrono::microseconds longest_sleep() const {
    return sending.empty() ? std::chrono::microseconds(kLongestSleep) : kLongestSleepWhileSending;
  }

  // This rank's pair sum (MpiOptions::pair_sums), if it holds an endpoint of a pair.
  std::unique_ptr<MpiPairSum> pair;
  std::deque<MpiPairSum::Sum> pair_sums_queued;  // by start_pair_sum (under `mutex`)

  // True when a pair sum started or finished. Needs `mpi`.
  bool move_pair_sums() {
    if (!pair) return false;
    std::deque<MpiPairSum::Sum> queued;
    {
      std::lock_guard<std::mutex> lock(mutex);
      queued.swap(pair_sums_queued);
    }
    return pair->move(std::move(queued), doorbells.get(), [this](Message done) {
      inboxes.at(pair->endpoint())->push(std::move(done));
    });
  }
  bool pair_sums_in_flight() const { return pair && pair->in_flight(); }

  // One pass over every transfer; true when a message started or arrived. (A send that
  // completes is not traffic: counting it kept a sender's progress thread polling, a fifth of
  // the CPU of a 1 MiB stream, for no message sooner.) Needs `mpi`.
  bool poll() {
    const bool started = send_queued();
    const bool summed = move_pair_sums();
    return receive() || started || summed;
  }

  // A thread polling its inbox polls MPI too while no other thread does, so the message it
  // waits for can reach it without the progress thread's hand-off.
  void poll_while_waiting() {
    std::unique_lock<std::mutex> lock(mpi, std::try_to_lock);
    if (lock && !stopping && !abandoning) {
      poll();
    } else {
      std::this_thread::yield();
    }
  }

  void run() {
    using Clock = std::chrono::steady_clock;
    // Naps of a few microseconds would otherwise last the default 50 us timer slack.
    prctl(PR_SET_TIMERSLACK, 1UL);
    auto last_moved = Clock::now();
    auto nap = std::chrono::microseconds(1);
    while (!abandoning) {
      const uint32_t rung = doorbells ? doorbells->seen() : 0;
      std::unique_lock<std::mutex> lock(mpi);
      const bool moved = poll();
      if (stopping && sending.empty() && !receiving() && !pair_sums_in_flight() &&
          barrier == MPI_REQUEST_NULL) {
        std::lock_guard<std::mutex> queue_lock(mutex);
        // Every rank's sends are out once all have entered the barrier; receiving goes on
        // until then, so no message is left unreceived at MPI_Finalize.
        if (outgoing.empty()) check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &barrier), "MPI_Ibarrier");
      } else if (barrier != MPI_REQUEST_NULL) {
        int done = 0;
        check_mpi(MPI_Test(&barrier, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) return;
      }
      const bool poll_again = must_poll();
      const auto longest = longest_sleep();
      lock.unlock();
      if (moved || poll_again) {
        if (moved) last_moved = Clock::now();
        std::this_thread::yield();
      } else if (Clock::now() - last_moved < options.spin) {
        // Just after traffic the next message is likely close (a reply, the next
        // microbatch): polling a little longer answers it without a nap's delay.
        std::this_thread::yield();
      } else if (doorbells) {
        // Idle: sleep until rung; then poll for `spin`, as after traffic.
        if (doorbells->wait(rung, longest)) {
          last_moved = Clock::now();
        } else {
          // No receiver has taken this rank's sends in flight for a while: MPI may have made
          // one visible only after its rings (a full queue), so the receiver is rung again.
          std::lock_guard<std::mutex> remind(mpi);
          for (const OutgoingFrame& frame : sending) doorbells->ring(frame.rank());
        }
        continue;
      } else {
        // Idle: nap, but wake at once for a send from this rank.
        std::unique_lock<std::mutex> queue_lock(mutex);
        wake.wait_for(queue_lock, nap,
                      [&] { return !outgoing.empty() || !pair_sums_queued.empty(); });
        nap = std::min(nap * 2, options.idle_sleep);
        continue;
      }
      nap = std::chrono::microseconds(1);
    }
  }
};

namespace {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiTransport::Impl> transport, int id,
                  std::shared_ptr<Inbox> inbox)
      : transport_(std::move(transport)), id_(id), inbox_(std::move(inbox)) {}
  int id() const override { return id_; }
  void send(int peer, Message message) override {
    auto& t = *transport_;
    auto rank = t.ranks.find(peer);
    PIPIT_CHECK(rank != t.ranks.end(), "MPI: endpoint ", id_, " sends to endpoint ", peer,
                ", which has no rank in the route table");
    if (rank->second == t.rank) {  // an endpoint of this rank: no MPI
      message.from = id_;
      t.inboxes.at(peer)->push(std::move(message));
      return;
    }
    OutgoingFrame frame(rank->second, id_, peer,
                        encode_frame_parts(message, t.options.checksum_tensor_bytes));
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      t.outgoing[rank->second].push_back(std::move(frame));
    }
    // Started here when MPI is free (after any queued before it, so order holds); else the
    // progress thread starts it.
    std::unique_lock<std::mutex> mpi(t.mpi, std::try_to_lock);
    if (mpi && !t.stopping && !t.abandoning) {
      t.send_queued();
    } else {
      t.wake_progress();
    }
  }
  bool has_pair_sum(int peer, DType dtype) const override {
    const auto& pair = transport_->pair;
    return pair && pair->endpoint() == id_ && pair->peer() == peer &&
           (dtype == DType::f32 || dtype == DType::f64);
  }
  void start_pair_sum(int peer, const Tensor& tensor, int64_t step, int part) override {
    auto& t = *transport_;
    PIPIT_CHECK(has_pair_sum(peer, tensor.dtype()), "MPI: endpoint ", id_, " has no pair sum of ",
                tensor.dtype(), " tensors with endpoint ", peer,
                " (MpiOptions::pair_sums; f32 and f64 only)");
    PIPIT_CHECK(tensor.device().is_cpu() && tensor.is_contiguous() &&
                    tensor.numel() <= std::numeric_limits<int>::max(),
                "MPI: a pair sum takes a contiguous CPU tensor of at most 2^31 - 1 elements, got ",
                tensor.numel(), " elements on ", tensor.device());
    MpiPairSum::Sum sum{step, part, tensor};
    t.pair->check_order(sum);
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      t.pair_sums_queued.push_back(std::move(sum));
    }
    std::unique_lock<std::mutex> mpi(t.mpi, std::try_to_lock);
    if (mpi && !t.stopping && !t.abandoning) {
      t.move_pair_sums();
    } else {
      t.wake_progress();
    }
  }
  Message receive() override { return inbox_->pop(); }
  std::optional<Message> try_receive(std::chrono::milliseconds timeout) override {
    return inbox_->pop_for(timeout);
  }
  void close() override { inbox_->close(); }

 private:
  std::shared_ptr<MpiTransport::Impl> transport_;
  int id_;
  std::shared_ptr<Inbox> inbox_;
};

}  // namespace

std::shared_ptr<MpiTransport> MpiTransport::start(std::map<int, int> ranks, MpiOptions options,
                                                  const std::string& fingerprint) {
  auto impl = std::make_unique<Impl>();
  impl->ranks = std::move(ranks);
  impl->options = options;
  const MpiJob job = mpi_job();
  impl->rank = job.rank;
  impl->world = job.world_size;
  impl->local_rank = job.local_rank;
  if (!fingerprint.empty()) {
    // Fixed-size digests, so every rank contributes the same count.
    const std::string mine = to_hex(sha256(fingerprint));
    std::string all(mine.size() * static_cast<size_t>(impl->world), '\0');
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(),
                            static_cast<int>(mine.size()), MPI_BYTE, MPI_COMM_WORLD),
              "MPI_Allgather");
    std::string differ;
    for (int r = 1; r < impl->world; ++r) {
      if (all.compare(static_cast<size_t>(r) * mine.size(), mine.size(), all, 0, mine.size())) {
        differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    PIPIT_CHECK(differ.empty(), "MPI: ranks ", differ,
                " built a different model or configuration than rank 0 (every rank must run "
                "the same program with the same flags and seed)");
  }
  impl->pair = MpiPairSum::open(impl->options.pair_sums, impl->ranks, impl->rank);
  impl->doorbells = NodeDoorbells::open(job.rank, job.world_size, job.local_size);
  for (const auto& [endpoint, rank] : impl->ranks) {
    PIPIT_CHECK(rank >= 0 && rank < impl->world, "MPI: endpoint ", endpoint, " is routed to rank ",
                rank, ", but the job has ranks 0..", impl->world - 1);
    if (rank == impl->rank) {
      impl->inboxes[endpoint] =
          std::make_shared<Inbox>("MPI endpoint " + std::to_string(endpoint),
                                  [t = impl.get()] { t->poll_while_waiting(); });
    }
  }
  auto transport = std::shared_ptr<MpiTransport>(new MpiTransport(std::move(impl)));
  transport->impl_->progress = std::thread([t = transport->impl_.get()] { t->run(); });
  return transport;
}

MpiTransport::MpiTransport(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

MpiTransport::~MpiTransport() {
  // Unwinding from an error: a barrier would wait for ranks that wait for this one. Leaving
  // without MPI_Finalize makes mpirun end every rank and exit non-zero, naming this one.
  if (std::uncaught_exceptions() > 0) {
    abandon();
  } else {
    stop();
  }
}

int MpiTransport::rank() const {
  return impl_->rank;
}
int MpiTransport::world_size() const {
  return impl_->world;
}
int MpiTransport::local_rank() const {
  return impl_->local_rank;
}
int64_t MpiTransport::pair_sums() const {
  return impl_->pair ? impl_->pair->done() : 0;
}

std::shared_ptr<Communicator> MpiTransport::endpoint(int endpoint) {
  auto inbox = impl_->inboxes.find(endpoint);
  PIPIT_CHECK(inbox != impl_->inboxes.end(), "MPI: endpoint ", endpoint, " does not live on rank ",
              impl_->rank);
  return std::make_shared<MpiCommunicator>(impl_, endpoint, inbox->second);
}

void MpiTransport::abandon() {
  if (!impl_->progress.joinable()) return;
  impl_->abandoning = true;
  impl_->wake_progress();
  impl_->progress.join();
  for (auto& [endpoint, inbox] : impl_->inboxes) inbox->close();
}

void MpiTransport::stop() {
  if (!impl_->progress.joinable()) return;
  impl_->stopping = true;
  impl_->wake_progress();
  impl_->progress.join();
  for (auto& [endpoint, inbox] : impl_->inboxes) inbox->close();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (impl_->pair) impl_->pair->release();
  MPI_Finalize();
}

}  // namespace pipit
