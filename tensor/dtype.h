#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

namespace pipit {

// Element types. f32 is the default; f64 serves gradient checks; i64 holds indices; b8 holds
// masks; f16 and bf16 ("half") hold weights and activations in half the bytes: elementwise ops,
// reductions and losses compute on them in f32 and round each result once.
enum class DType : uint8_t { f32, f64, i32, i64, b8, f16, bf16 };

size_t dtype_size(DType dtype);
bool is_floating(DType dtype);
// f16 or bf16.
bool is_half(DType dtype);
// The dtype sums over elements of a floating `dtype` are returned in: f32 for half dtypes,
// else dtype itself (a loss per row, attention's log-sum-exp).
DType accumulate_dtype(DType dtype);
// Name as safetensors writes it: "F32", "F64", "I32", "I64", "BOOL", "F16", "BF16".
const char* dtype_name(DType dtype);
// Inverse of dtype_name; throws naming the unknown string.
DType dtype_from_name(const std::string& name);
std::ostream& operator<<(std::ostream& out, DType dtype);

// Maps a C++ type to its DType (float -> f32, ...).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::b8;
};

// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);
// Inline, so that conversion loops vectorize: bf16 is the top half of an f32.
// Branch-free (a select, not a jump) so that loops of it vectorize.
inline uint16_t float_to_bfloat16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace pipit
