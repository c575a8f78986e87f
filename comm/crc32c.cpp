#include "comm/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pipit {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // CRC-32C, reflected

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t update_table(uint32_t crc, const uint8_t* data, size_t size) {
  for (size_t i = 0; i < size; ++i) crc = (crc >> 8) ^ kTable[(crc ^ data[i]) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t crc, const uint8_t* data,
                                                        size_t size) {
  uint64_t wide = crc;
  for (; size >= 8; data += 8, size -= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    wide = _mm_crc32_u64(wide, word);
  }
  crc = static_cast<uint32_t>(wide);
  for (; size > 0; ++data, --size) crc = _mm_crc32_u8(crc, *data);
  return crc;
}

bool has_sse42() {
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("sse4.2"));
  return has;
}
#endif

}  // namespace

void Crc32c::update(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (has_sse42()) {
    state_ = update_sse42(state_, bytes, size);
    return;
  }
#endif
  state_ = update_table(state_, bytes, size);
}

}  // namespace pipit
