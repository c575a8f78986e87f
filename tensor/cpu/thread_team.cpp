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

// Threads in this process's teams, callers included. When they outnumber the cores, waiting
// threads sleep at once: polling would take a core from a thread with work (as libgomp
// throttles its spin when it manages more threads than there are cores).
std::atomic<int> g_team_threads{0};
const int g_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

class Team {
 public:
  Team() : forks_(g_forks.load()) { g_team_threads.fetch_add(1); }

  ~Team() {
    if (!ours()) {
      new std::vector<std::thread>(std::move(helpers_));  // the parent's threads: never joined
      return;
    }
    start_generation(0);
    for (std::thread& helper : helpers_) helper.join();
    g_team_threads.fetch_sub(1 + static_cast<int>(helpers_.size()));
  }

  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  bool ours() const { return forks_ == g_forks.load(std::memory_order_relaxed); }

  void run(int threads, const std::function<void(int, int)>& body) {
    while (static_cast<int>(helpers_.size()) < threads - 1) {
      const int index = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, index] { help(index); });
      g_team_threads.fetch_add(1);
    }
    body_ = &body;
    pending_.store(threads - 1, std::memory_order_relaxed);
    error_ = nullptr;
    start_generation(threads);
    run_part(0, threads);
    wait_for_helpers();
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
      // seq_cst, against wait_for_helpers(): either it sees the count reach 0, or this sees it
      // sleeping.
      if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) pending_.notify_one();
    }
  }

  static bool cores_to_spare() { return g_team_threads.load(std::memory_order_relaxed) <= g_cores; }

  // Polls until done() or `longest` has passed, spinning for kHelperSpin, then yielding the
  // core; at once, where the process's teams outnumber the cores (a thread with work wants
  // the core). True if done.
  template <typename Done>
  static bool poll(Done done, Clock::duration longest) {
    if (!cores_to_spare()) return done();
    const auto start = Clock::now();
    for (auto waited = Clock::duration{}; !done(); waited = Clock::now() - start) {
      if (waited >= longest) return false;
      if (waited < kHelperSpin) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
    return true;
  }

  // The parts run about as long as the caller's, so it polls for them.
  void wait_for_helpers() {
    auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (poll(finished, Clock::duration::max())) return;
    caller_sleeping_.store(true);
    for (int left = pending_.load(); left > 0; left = pending_.load()) pending_.wait(left);
    caller_sleeping_.store(false);
  }

  // Waits for the generation after `seen`; `last_wait` is how long the previous wait took.
  uint64_t next_generation(uint64_t seen, Clock::duration& last_wait) {
    const auto start = Clock::now();
    uint64_t now = seen;
    auto started = [&] {
      now = generation_.load(std::memory_order_acquire);
      return now != seen;
    };
    const bool in_burst = last_wait < kHelperPollBeforeSleep;
    poll(started, in_burst ? Clock::duration(kHelperPollBeforeSleep) : kHelperSpin);
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
  std::atomic<bool> caller_sleeping_{false};
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
