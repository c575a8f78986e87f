// The helper threads CPU kernels split loops over (tensor/cpu/thread_team.h): every part runs
// exactly once per loop, with the thread count that loop asked for, whether the helpers were
// polling or asleep; exceptions come back to the caller; nested loops and several calling
// threads each work.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tensor/cpu/thread_team.h"

using pipit::cpu::run_on_team;

namespace {

// Runs one loop of `threads` parts and checks each ran once and saw that count.
void check_one_loop(int threads) {
  std::vector<std::atomic<int>> calls(static_cast<size_t>(threads));
  std::atomic<int> wrong_count{0};
  run_on_team(threads, [&](int t, int nt) {
    if (nt != threads) wrong_count.fetch_add(1);
    calls.at(static_cast<size_t>(t)).fetch_add(1);
  });
  REQUIRE(wrong_count.load() == 0);
  for (int t = 0; t < threads; ++t) REQUIRE(calls[static_cast<size_t>(t)].load() == 1);
}

}  // namespace

TEST_CASE("thread team runs each part once, with the count each loop asked for",
          "[tensor][threads]") {
  // Counts that rise and fall back to back: a helper left out of one loop must not join the
  // next one early or twice.
  for (int round = 0; round < 3000; ++round) check_one_loop(1 + (round * 7) % 5);
  // Pauses longer than the helpers poll, so they sleep and must be woken.
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(pipit::cpu::kHelperPollBeforeSleep * 5);
    check_one_loop(4);
  }
}

TEST_CASE("thread team rethrows a part's exception and stays usable", "[tensor][threads]") {
  for (int failing : {0, 2}) {
    CHECK_THROWS_WITH(run_on_team(4,
                                  [&](int t, int) {
                                    if (t == failing) throw std::runtime_error("part failed");
                                  }),
                      "part failed");
    check_one_loop(4);
  }
}

TEST_CASE("thread team runs nested loops on the calling part alone", "[tensor][threads]") {
  std::atomic<int> inner_parts{0}, inner_counts_wrong{0};
  run_on_team(3, [&](int, int) {
    run_on_team(4, [&](int, int nt) {
      inner_parts.fetch_add(1);
      if (nt != 1) inner_counts_wrong.fetch_add(1);
    });
  });
  CHECK(inner_parts.load() == 3);
  CHECK(inner_counts_wrong.load() == 0);
}

TEST_CASE("thread teams of several calling threads work side by side", "[tensor][threads]") {
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 500; ++round) {
        const int threads = 2 + (round + c) % 3;
        std::atomic<int> parts{0};
        run_on_team(threads, [&](int, int) { parts.fetch_add(1); });
        if (parts.load() != threads) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  CHECK(failures.load() == 0);
}

TEST_CASE("thread team runs loops in a forked child on the child's thread", "[tensor][threads]") {
  check_one_loop(3);  // the parent's team has helpers now
  const pid_t child = ::fork();
  if (child == 0) {
    int parts = 0, counts = 0;
    run_on_team(3, [&](int, int nt) {
      ++parts;
      counts += nt;
    });
    ::_exit(parts == 1 && counts == 1 ? 0 : 1);
  }
  REQUIRE(child > 0);
  int status = -1;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  check_one_loop(3);
}
