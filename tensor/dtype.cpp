#include "tensor/dtype.h"

#include <cstring>

#include "tensor/error.h"

namespace pipit {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::b8:
      return 1;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
  }
  throw Error("dtype_size: invalid dtype");
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || is_half(dtype);
}

bool is_half(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16;
}

DType accumulate_dtype(DType dtype) {
  return is_half(dtype) ? DType::f32 : dtype;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::b8:
      return "BOOL";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
  }
  return "invalid";
}

DType dtype_from_name(const std::string& name) {
  for (DType d :
       {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8, DType::f16, DType::bf16}) {
    if (name == dtype_name(d)) return d;
  }
  throw Error("unknown dtype '" + name + "' (expected F32, F64, I32, I64, BOOL, F16 or BF16)");
}

std::ostream& operator<<(std::ostream& out, DType dtype) {
  return out << dtype_name(dtype);
}

static uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

uint16_t float_to_half(float value) {
  uint32_t x = float_bits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  int32_t e = static_cast<int32_t>(exponent) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mantissa = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) ++half_mantissa;
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

float half_to_float(uint16_t bits) {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --exponent;
    }
    ++exponent;
    mantissa &= ~0x400u;
  } else if (exponent == 31) {
    return bits_float(sign | 0x7f800000u | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

}  // namespace pipit
