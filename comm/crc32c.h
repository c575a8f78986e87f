#pragma once
// CRC-32C (Castagnoli), the checksum of every frame: TCP's own 16-bit checksum lets rare
// corruptions through (bad NICs, middleboxes, memory errors), and a flipped byte in tensor
// data would otherwise change training silently. Inputs of 256 bytes or more fold 64 bytes
// at a time with carry-less multiplication where the CPU has AVX-512 and VPCLMULQDQ (about
// twice the crc32 instruction's speed); otherwise the SSE4.2 crc32 instruction, or a table
// on CPUs without it. All give the same values.
#include <cstddef>
#include <cstdint>
#include <string_view>

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

}  // namespace pipit
