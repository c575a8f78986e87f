#pragma once
// CRC-32C (Castagnoli), the checksum of every frame: TCP's own 16-bit checksum lets rare
// corruptions through (bad NICs, middleboxes, memory errors), and a flipped byte in tensor
// data would otherwise change training silently. Inputs of a few hundred bytes or more fold
// with carry-less multiplication where the CPU has VPCLMULQDQ (AVX-512: about twice the
// crc32 instruction's speed); otherwise the SSE4.2 crc32 instruction, or a table on CPUs
// without it. All give the same values.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipit {

class Crc32c {
 public:
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  uint32_t value() const { return ~state_; }

 private:
  uint32_t state_ = 0xffffffffu;
};

inline uint32_t crc32c(std::string_view bytes) {
  Crc32c crc;
  crc.update(bytes);
  return crc.value();
}

namespace detail {
// For tests that hold the implementations to one another: the names of those this CPU runs
// ("vpclmul512", "vpclmul256", "sse42", "table"), fastest first, and the CRC-32C of `bytes`
// by one of them (the folding ones need at least 256 or 128 bytes).
std::vector<std::string> crc32c_implementations();
uint32_t crc32c_with(std::string_view implementation, std::string_view bytes);
}  // namespace detail

}  // namespace pipit
