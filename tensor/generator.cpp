#include "tensor/generator.h"

namespace pipit {

Generator& Generator::operator=(const Generator& other) {
  seed_ = other.seed_;
  offset_.store(other.offset());
  return *this;
}

void Generator::manual_seed(uint64_t seed) {
  set_state(seed, 0);
}

void Generator::set_state(uint64_t seed, uint64_t offset) {
  seed_ = seed;
  offset_.store(offset);
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The splitmix64 stream whose start is the mixed seed: the index-th output is independent of
// every other index, so blocks fill in parallel.
uint64_t Generator::bits(uint64_t index) const {
  return mix64(mix64(seed_ ^ 0x632be59bd9b4e019ull) + (index + 1) * 0x9e3779b97f4a7c15ull);
}

double Generator::uniform(uint64_t index) const {
  return static_cast<double>(bits(index) >> 11) * (1.0 / 9007199254740992.0);
}

Generator& default_generator() {
  static Generator generator;
  return generator;
}

void manual_seed(uint64_t seed) {
  default_generator().manual_seed(seed);
}

}  // namespace pipit
