#pragma once
// The messages of pipelined generation (pipeline/generation/pipelined_generation.h):
// GenerateBegin's fields, and a GenerateStep's start position.
#include <cstdint>
#include <vector>

#include "comm/message.h"

namespace pipit {

// The GenerateBegin command: caches for `batch` rows of `capacity` positions, row b left-padded
// by padding[b].
struct GenerateBegin {
  int64_t batch = 0, capacity = 0;
  std::vector<int64_t> padding;
};
Message to_message(const GenerateBegin& begin, int64_t step);
// Checks every field (sizes bounded, one padding per row, each below the capacity).
GenerateBegin read_generate_begin(const Message& message);
// A GenerateStep's start position.
int64_t read_generate_start(const Message& message);

}  // namespace pipit
