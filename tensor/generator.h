#pragma once
#include <atomic>
#include <cstdint>

namespace pipit {

// Counter-based random generator: the n-th number drawn from seed s is a pure function of
// (s, n). Its whole state is (seed, offset), so it checkpoints trivially, and a block of
// numbers can be filled in parallel with the same result on any thread count.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed), offset_(0) {}
  Generator(const Generator& other) : seed_(other.seed_), offset_(other.offset()) {}
  Generator& operator=(const Generator& other);

  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_.load(); }
  void set_state(uint64_t seed, uint64_t offset);

  // Reserves n consecutive counters and returns the first: thread-safe.
  uint64_t reserve(uint64_t n) { return offset_.fetch_add(n); }
  // The 64 random bits for counter `index`.
  uint64_t bits(uint64_t index) const;
  // Uniform in [0, 1) for counter `index`.
  double uniform(uint64_t index) const;

 private:
  uint64_t seed_;
  std::atomic<uint64_t> offset_;
};

// The process-wide generator used when none is given.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace pipit
