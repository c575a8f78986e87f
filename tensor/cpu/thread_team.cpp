#include "tensor/cpu/thread_team.h"

#include <immintrin.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pipit::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Counts fork() calls; a team made before the latest one belongs to the parent, whose
// helpers do not exist in this process.
std::atomic<int> g_forks{0};
const int g_fork_handler = pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1); });

thread_local bool t_in_body = false;

class Team {
 public:
  Team() : forks_(g_forks.load()) {}

  ~Team() {
    if (!ours()) {
      new std::vector<std::thread>(std::move(helpers_));  // the parent's threads: never joined
      return;
    }
    start_generation(0);
    for (std::thread& helper : helpers_) helper.join();
  }

  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  bool ours() const { return forks_ == g_forks.load(std::memory_order_relaxed); }

  void run(int threads, const std::function<void(int, int)>& body) {
    while (static_cast<int>(helpers_.size()) < threads - 1) {
      const int index = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, index] { help(index); });
    }
    body_ = &body;
    pending_.store(threads - 1, std::memory_order_relaxed);
    error_ = nullptr;
    start_generation(threads);
    run_part(0, threads);
    while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // A generation is one loop: its count in the high bits, its threads in the low ones (0:
  // the team is stopping), so a helper reads both in one load.
  static constexpr int kThreadBits = 16;
  static int threads_of(uint64_t generation) {
    return static_cast<int>(generation & ((uint64_t{1} << kThreadBits) - 1));
  }

  void start_generation(int threads) {
    const uint64_t count = (generation_.load(std::memory_order_relaxed) >> kThreadBits) + 1;
    // seq_cst on both sides: either a helper about to sleep sees the new generation, or this
    // thread sees it sleeping and wakes it.
    generation_.store(count << kThreadBits | static_cast<uint64_t>(threads));
    if (sleepers_.load() > 0) generation_.notify_all();
  }

  void help(int index) {
    uint64_t seen = 0;
    Clock::duration last_wait{};
    for (;;) {
      seen = next_generation(seen, last_wait);
      const int threads = threads_of(seen);
      if (threads == 0) return;
      if (index >= threads) continue;
      run_part(index, threads);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  // Waits for the generation after `seen`; `last_wait` is how long the previous wait took.
  uint64_t next_generation(uint64_t seen, Clock::duration& last_wait) {
    const auto start = Clock::now();
    const auto spin_until = start + kHelperSpin;
    const auto poll_until =
        last_wait < kHelperPollBeforeSleep ? start + kHelperPollBeforeSleep : spin_until;
    uint64_t now = generation_.load(std::memory_order_acquire);
    for (auto time = start; now == seen && time < poll_until; time = Clock::now()) {
      if (time < spin_until) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      sleepers_.fetch_add(1);
      for (now = generation_.load(); now == seen; now = generation_.load()) {
        generation_.wait(seen);
      }
      sleepers_.fetch_sub(1);
    }
    last_wait = Clock::now() - start;
    return now;
  }

  void run_part(int index, int threads) {
    t_in_body = true;
    try {
      (*body_)(index, threads);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    t_in_body = false;
  }

  const int forks_;
  std::vector<std::thread> helpers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int, int)>* body_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace

void run_on_team(int threads, const std::function<void(int, int)>& body) {
  (void)g_fork_handler;
  if (threads <= 1 || t_in_body) {
    body(0, 1);
    return;
  }
  thread_local Team team;
  threads = std::min(threads, (1 << 16) - 1);
  if (!team.ours()) {
    body(0, 1);
    return;
  }
  team.run(threads, body);
}

}  // namespace pipit::cpu
