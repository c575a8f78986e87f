#pragma once
// The safetensors JSON header in its plain form, written and read without the JSON library:
// every frame with tensors carries one, and the library's writing and parsing cost more than
// the rest of a small frame's encoding and decoding. Plain means no "__metadata__" and names
// of letters, digits and ._-/: only (nothing JSON escapes), written exactly as the library
// writes the same header (names sorted, keys sorted, no spaces, unsigned integers), so
// either way a reader sees the same bytes. The reader takes only that form (names strictly
// increasing, so none repeats); for anything else it returns nullopt and the caller parses
// with the library, which reads the same fields from every header this one accepts.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codec/safetensors.h"

namespace pipit {

// The header's JSON for `tensors` laid out in order (before padding); nullopt if a name is
// not plain or appears twice.
std::optional<std::string> write_plain_safetensors_header(const OrderedTensors& tensors);

struct PlainSafetensorsEntry {
  std::string_view name, dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;
};
// The entries of a plain header (`text` may end in the spaces that pad it), in name order.
std::optional<std::vector<PlainSafetensorsEntry>> read_plain_safetensors_header(
    std::string_view text);

}  // namespace pipit
