#pragma once
// The flags of a run that several programs take with one meaning, declared once: --threads,
// the CPU threads per kernel, and --seed, the random seed.
#include <cstdint>
#include <string>

#include "support/flags.h"

namespace pipit::support {

// --threads, `default_value` unless given; `zero_means`, for a program that takes 0, says what
// it does then.
inline void add_threads_flag(Flags& flags, const std::string& default_value,
                             const std::string& zero_means = "") {
  flags.add("threads", default_value,
            "CPU threads per kernel" + (zero_means.empty() ? "" : " (0: " + zero_means + ")"));
}

// --seed, `default_value` unless given; `draws` names what it draws (weights, batches, ...).
inline void add_seed_flag(Flags& flags, const std::string& default_value,
                          const std::string& draws) {
  flags.add("seed", default_value, "random seed (" + draws + ")");
}

inline uint64_t seed_flag(const Flags& flags) {
  return static_cast<uint64_t>(flags.integer("seed", 0));
}

}  // namespace pipit::support
