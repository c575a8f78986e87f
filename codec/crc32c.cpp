#include "codec/crc32c.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
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

// x^n mod P in the form the crc32 instruction keeps its register in (reflected: bit 31
// holds the coefficient of x^0).
uint32_t x_power_mod(uint64_t n) {
  uint32_t value = 0x80000000u;
  for (; n > 0; --n) value = (value >> 1) ^ ((value & 1) ? kPolynomial : 0);
  return value;
}

// Carry-less multiplication folds the input 128 bits at a time (Intel, "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ"): a 128-bit lane moved forward by d bytes is its
// low half times x^(8d+64) plus its high half times x^(8d), both mod P, xored into the data
// there. A reflected 64x32-bit product comes out shifted by 33 bits, hence the -33.
// VPCLMULQDQ folds two (AVX2) or four (AVX-512) lanes at once; four registers are in flight
// to cover the multiplier's latency.
struct FoldConstants {
  uint64_t low, high;
  explicit FoldConstants(uint64_t bytes)
      : low(x_power_mod(8 * bytes + 64 - 33)), high(x_power_mod(8 * bytes - 33)) {}
};

#define PIPIT_CLMUL_TARGET __attribute__((target("pclmul,sse4.2")))
#define PIPIT_VPCLMUL256_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))
#define PIPIT_VPCLMUL512_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

PIPIT_CLMUL_TARGET __m128i fold_lane(__m128i lane, FoldConstants k, __m128i data) {
  const __m128i constants =
      _mm_set_epi64x(static_cast<int64_t>(k.high), static_cast<int64_t>(k.low));
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lane, constants, 0x00),
                                     _mm_clmulepi64_si128(lane, constants, 0x11)),
                       data);
}

// Folds the last whole 16-byte blocks into `lane`, reduces it to the CRC register with the
// crc32 instruction (from 0, as the lane already holds the register's start) and finishes
// the tail byte by byte.
PIPIT_CLMUL_TARGET uint32_t finish_folding(__m128i lane, const uint8_t* data, size_t size) {
  static const FoldConstants by16(16);
  for (; size >= 16; data += 16, size -= 16) {
    lane = fold_lane(lane, by16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(data)));
  }
  uint64_t crc = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(lane)));
  crc = _mm_crc32_u64(crc, static_cast<uint64_t>(_mm_extract_epi64(lane, 1)));
  return update_sse42_serial(static_cast<uint32_t>(crc), data, size);
}

PIPIT_VPCLMUL256_TARGET __m256i fold_lanes(__m256i lanes, __m256i constants, __m256i data) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(lanes, constants, 0x00),
                                           _mm256_clmulepi64_epi128(lanes, constants, 0x11)),
                          data);
}

PIPIT_VPCLMUL512_TARGET __m512i fold_lanes(__m512i lanes, __m512i constants, __m512i data) {
  // 0x96: the three-way xor.
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(lanes, constants, 0x00),
                                   _mm512_clmulepi64_epi128(lanes, constants, 0x11), data, 0x96);
}

PIPIT_VPCLMUL256_TARGET __m256i broadcast256(FoldConstants k) {
  const auto low = static_cast<int64_t>(k.low), high = static_cast<int64_t>(k.high);
  return _mm256_set_epi64x(high, low, high, low);
}

PIPIT_VPCLMUL256_TARGET __m256i load(const uint8_t* at) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
}

PIPIT_VPCLMUL512_TARGET __m512i broadcast512(FoldConstants k) {
  const auto low = static_cast<int64_t>(k.low), high = static_cast<int64_t>(k.high);
  return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}

constexpr size_t kFoldStep256 = 4 * 32, kFoldStep512 = 4 * 64;

// Needs size >= kFoldStep256.
PIPIT_VPCLMUL256_TARGET uint32_t update_vpclmul256(uint32_t crc, const uint8_t* data, size_t size) {
  static const FoldConstants by_step(kFoldStep256), by32(32), by16(16);
  __m256i x0 = _mm256_xor_si256(load(data),
                                _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m256i x1 = load(data + 32), x2 = load(data + 64), x3 = load(data + 96);
  data += kFoldStep256;
  size -= kFoldStep256;
  const __m256i step = broadcast256(by_step);
  for (; size >= kFoldStep256; data += kFoldStep256, size -= kFoldStep256) {
    x0 = fold_lanes(x0, step, load(data));
    x1 = fold_lanes(x1, step, load(data + 32));
    x2 = fold_lanes(x2, step, load(data + 64));
    x3 = fold_lanes(x3, step, load(data + 96));
  }
  const __m256i next = broadcast256(by32);
  __m256i x = fold_lanes(fold_lanes(fold_lanes(x0, next, x1), next, x2), next, x3);
  for (; size >= 32; data += 32, size -= 32) x = fold_lanes(x, next, load(data));
  alignas(32) __m128i lanes[2];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
  return finish_folding(fold_lane(lanes[0], by16, lanes[1]), data, size);
}

// Needs size >= kFoldStep512.
PIPIT_VPCLMUL512_TARGET uint32_t update_vpclmul512(uint32_t crc, const uint8_t* data, size_t size) {
  static const FoldConstants by_step(kFoldStep512), by64(64), by48(48), by32(32), by16(16);
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(data),
                                _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i x1 = _mm512_loadu_si512(data + 64);
  __m512i x2 = _mm512_loadu_si512(data + 128);
  __m512i x3 = _mm512_loadu_si512(data + 192);
  data += kFoldStep512;
  size -= kFoldStep512;
  const __m512i step = broadcast512(by_step);
  for (; size >= kFoldStep512; data += kFoldStep512, size -= kFoldStep512) {
    x0 = fold_lanes(x0, step, _mm512_loadu_si512(data));
    x1 = fold_lanes(x1, step, _mm512_loadu_si512(data + 64));
    x2 = fold_lanes(x2, step, _mm512_loadu_si512(data + 128));
    x3 = fold_lanes(x3, step, _mm512_loadu_si512(data + 192));
  }
  const __m512i next = broadcast512(by64);
  __m512i x = fold_lanes(fold_lanes(fold_lanes(x0, next, x1), next, x2), next, x3);
  for (; size >= 64; data += 64, size -= 64) x = fold_lanes(x, next, _mm512_loadu_si512(data));
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, x);
  return finish_folding(
      fold_lane(lanes[0], by48, fold_lane(lanes[1], by32, fold_lane(lanes[2], by16, lanes[3]))),
      data, size);
}

#endif

using Update = uint32_t (*)(uint32_t, const uint8_t*, size_t);

struct Implementation {
  const char* name;
  Update update;
  size_t from_size;  // used for inputs of at least this many bytes
};

// Fastest first; each entry this CPU can run.
const std::vector<Implementation>& implementations() {
  static const std::vector<Implementation> all = [] {
    std::vector<Implementation> found;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool sse42 = __builtin_cpu_supports("sse4.2");
    const bool clmul =
        sse42 && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("vpclmulqdq");
    if (clmul && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) {
      found.push_back({"vpclmul512", update_vpclmul512, kFoldStep512});
    }
    if (clmul && __builtin_cpu_supports("avx2")) {
      found.push_back({"vpclmul256", update_vpclmul256, kFoldStep256});
    }
    if (sse42) found.push_back({"sse42", update_sse42, 0});
#endif
    found.push_back({"table", update_table, 0});
    return found;
  }();
  return all;
}

}  // namespace

void Crc32c::update(const void* data, size_t size) {
  for (const Implementation& implementation : implementations()) {
    if (size >= implementation.from_size) {
      state_ = implementation.update(state_, static_cast<const uint8_t*>(data), size);
      return;
    }
  }
}

namespace detail {

std::vector<std::string> crc32c_implementations() {
  std::vector<std::string> names;
  for (const Implementation& implementation : implementations()) {
    names.push_back(implementation.name);
  }
  return names;
}

uint32_t crc32c_with(std::string_view implementation, std::string_view bytes) {
  for (const Implementation& candidate : implementations()) {
    if (implementation == candidate.name && bytes.size() >= candidate.from_size) {
      return ~candidate.update(0xffffffffu, reinterpret_cast<const uint8_t*>(bytes.data()),
                               bytes.size());
    }
  }
  throw std::invalid_argument("crc32c_with: " + std::string(implementation) +
                              " does not run here or needs a longer input");
}

}  // namespace detail

}  // namespace pipit
