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
__attribute__((target("sse4.2"))) uint32_t update_sse42_serial(uint32_t crc, const uint8_t* data,
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

// The crc32 instruction takes 3 cycles but can start one every cycle, so one dependent chain
// runs at a third of its speed. Large inputs go in blocks of three stripes of kStripe bytes,
// each stripe its own chain; the three are joined with the CRC's linearity: the register
// after stripes A, B, C is shift(shift(crc(A), L) ^ crc(B), L) ^ crc(C), where crc(B) and
// crc(C) start from 0 and shift(x, L) is x run through L zero bytes, a linear map applied
// with four 256-entry tables.
constexpr size_t kStripe = 4096;

struct StripeShift {
  std::array<std::array<uint32_t, 256>, 4> table{};

  StripeShift() {
    // shift is linear over GF(2): the image of each bit of x, then of each byte value.
    static const uint8_t zeros[kStripe] = {};
    uint32_t bit_image[32];
    for (int bit = 0; bit < 32; ++bit) {
      bit_image[bit] = update_sse42_serial(uint32_t{1} << bit, zeros, kStripe);
    }
    for (int byte = 0; byte < 4; ++byte) {
      for (uint32_t value = 0; value < 256; ++value) {
        uint32_t image = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (value & (1u << bit)) image ^= bit_image[8 * byte + bit];
        }
        table[static_cast<size_t>(byte)][value] = image;
      }
    }
  }

  uint32_t operator()(uint32_t x) const {
    return table[0][x & 0xff] ^ table[1][(x >> 8) & 0xff] ^ table[2][(x >> 16) & 0xff] ^
           table[3][x >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t crc, const uint8_t* data,
                                                        size_t size) {
  if (size >= 3 * kStripe) {
    static const StripeShift shift;
    for (; size >= 3 * kStripe; data += 3 * kStripe, size -= 3 * kStripe) {
      uint64_t a = crc, b = 0, c = 0;
      for (size_t i = 0; i < kStripe; i += 8) {
        uint64_t wa, wb, wc;
        std::memcpy(&wa, data + i, 8);
        std::memcpy(&wb, data + kStripe + i, 8);
        std::memcpy(&wc, data + 2 * kStripe + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        c = _mm_crc32_u64(c, wc);
      }
      crc = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
            static_cast<uint32_t>(c);
    }
  }
  return update_sse42_serial(crc, data, size);
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
