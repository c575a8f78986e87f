#pragma once
// The MPI tests' program, run by mpirun from tests/mpi_test.cpp:
//   mpirun -np 3 pipit_tests --mpi-role exchange
// Endpoints: the coordinator (-1) and stage 0 on rank 0, stage r on rank r. Every endpoint
// sends every other one tensors of several dtypes and sizes (up to 8 MiB), from two threads
// at once, 200 messages each; receivers check every value, the sender, and that each
// sender's messages of one thread arrive in order. Prints "rank R ok" or the first mismatch,
// and returns non-zero on any.
#ifdef PIPIT_WITH_MPI
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "pipit.h"

namespace pipit::testing {

inline Tensor mpi_payload(int from, int to, int thread, int index) {
  const int64_t n = index % 50 == 0 ? (int64_t{1} << 21) : 1 + index % 7;  // some 8 MiB
  Tensor t = full({n}, from * 1000 + to * 10 + thread + index * 1e-3);
  return index % 3 == 0 ? t.to(DType::bf16) : t;
}

inline int mpi_role_main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[2]) != "exchange") return 2;
  auto transport = MpiTransport::start({{-1, 0}, {0, 0}, {1, 1}, {2, 2}});
  const int rank = transport->rank();
  if (transport->world_size() != 3) {
    std::fprintf(stderr, "rank %d: the exchange needs 3 ranks, got %d\n", rank,
                 transport->world_size());
    return 2;
  }
  std::vector<int> mine = rank == 0 ? std::vector<int>{-1, 0} : std::vector<int>{rank};
  const std::vector<int> all = {-1, 0, 1, 2};
  constexpr int kThreads = 2, kMessages = 200;
  int failures = 0;
  std::vector<std::thread> threads;
  std::mutex mutex;
  for (int me : mine) {
    auto comm = transport->endpoint(me);
    for (int thread = 0; thread < kThreads; ++thread) {
      threads.emplace_back([comm, me, thread, &all] {
        for (int index = 0; index < kMessages; ++index) {
          for (int to : all) {
            if (to == me) continue;
            comm->send(to, Message(MessageKind::Activation, index, thread, 0,
                                   {mpi_payload(me, to, thread, index)}));
          }
        }
      });
    }
    threads.emplace_back([comm, me, &all, &failures, &mutex] {
      std::map<std::pair<int, int>, int> next;  // (sender, thread) -> next index
      const int expected = (static_cast<int>(all.size()) - 1) * kThreads * kMessages;
      for (int received = 0; received < expected; ++received) {
        std::optional<Message> m = comm->try_receive(std::chrono::seconds(60));
        std::lock_guard<std::mutex> lock(mutex);
        if (!m) {
          std::fprintf(stderr, "endpoint %d: only %d of %d messages in time\n", me, received,
                       expected);
          ++failures;
          return;
        }
        const int thread = m->microbatch, index = static_cast<int>(m->step);
        int& want = next[{m->from, thread}];
        const Tensor expect = mpi_payload(m->from, me, thread, index);
        const bool same =
            m->tensors.size() == 1 && m->tensors[0].shape() == expect.shape() &&
            m->tensors[0].dtype() == expect.dtype() &&
            std::memcmp(m->tensors[0].raw_data(), expect.raw_data(), expect.nbytes()) == 0;
        if (index != want || !same) {
          std::fprintf(stderr, "endpoint %d: message %d of sender %d thread %d (wanted %d)%s\n", me,
                       index, m->from, thread, want, same ? "" : " has wrong values");
          ++failures;
        }
        want = index + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  transport->stop();
  std::printf("rank %d %s\n", rank, failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace pipit::testing
#endif
