#pragma once
// The dtype switches both backends dispatch their kernels with, written once. Each case runs
// the body with `scalar_t` set to the dtype's element type; any other dtype throws naming the
// op. The lists with half dtypes take the backend's element types for f16 and bf16
// (tensor/cpu/loop.h and tensor/cuda/common.cuh name them).
#include "tensor/dtype.h"
#include "tensor/error.h"

#define PIPIT_DTYPE_CASE(DT, T, ...) \
  case DT: {                         \
    using scalar_t = T;              \
    __VA_ARGS__;                     \
    break;                           \
  }

// Kept by hand: clang-format reads `cases default:` as one label.
// clang-format off
#define PIPIT_DTYPE_SWITCH(dtype, op, expected, cases)                                    \
  switch (dtype) {                                                                        \
    cases                                                                                 \
    default:                                                                              \
      throw ::pipit::Error(                                                               \
          ::pipit::detail::concat(op, ": dtype ", dtype, " is not supported", expected)); \
  }
// clang-format on

#define PIPIT_FLOAT_CASES(...)                              \
  PIPIT_DTYPE_CASE(::pipit::DType::f32, float, __VA_ARGS__) \
  PIPIT_DTYPE_CASE(::pipit::DType::f64, double, __VA_ARGS__)
#define PIPIT_INTEGER_CASES(...)                              \
  PIPIT_DTYPE_CASE(::pipit::DType::i32, int32_t, __VA_ARGS__) \
  PIPIT_DTYPE_CASE(::pipit::DType::i64, int64_t, __VA_ARGS__)
#define PIPIT_HALF_CASES(HALF, BFLOAT, ...)                \
  PIPIT_DTYPE_CASE(::pipit::DType::f16, HALF, __VA_ARGS__) \
  PIPIT_DTYPE_CASE(::pipit::DType::bf16, BFLOAT, __VA_ARGS__)

// f32 and f64.
#define PIPIT_DISPATCH_FLOAT(dtype, op, ...) \
  PIPIT_DTYPE_SWITCH(dtype, op, " (expected F32 or F64)", PIPIT_FLOAT_CASES(__VA_ARGS__))
// f32, f64, i32 and i64.
#define PIPIT_DISPATCH_NUMERIC(dtype, op, ...) \
  PIPIT_DTYPE_SWITCH(dtype, op, "", PIPIT_FLOAT_CASES(__VA_ARGS__) PIPIT_INTEGER_CASES(__VA_ARGS__))
// The floating dtypes, half ones included.
#define PIPIT_DISPATCH_FLOAT_AND_HALF_AS(HALF, BFLOAT, dtype, op, ...) \
  PIPIT_DTYPE_SWITCH(dtype, op, " (expected a float dtype)",           \
                     PIPIT_FLOAT_CASES(__VA_ARGS__) PIPIT_HALF_CASES(HALF, BFLOAT, __VA_ARGS__))
// Every numeric dtype, half ones included.
#define PIPIT_DISPATCH_NUMERIC_AND_HALF_AS(HALF, BFLOAT, dtype, op, ...)             \
  PIPIT_DTYPE_SWITCH(dtype, op, "",                                                  \
                     PIPIT_FLOAT_CASES(__VA_ARGS__) PIPIT_INTEGER_CASES(__VA_ARGS__) \
                         PIPIT_HALF_CASES(HALF, BFLOAT, __VA_ARGS__))
// Every dtype.
#define PIPIT_DISPATCH_ALL_AS(HALF, BFLOAT, dtype, op, ...)                          \
  PIPIT_DTYPE_SWITCH(dtype, op, "",                                                  \
                     PIPIT_FLOAT_CASES(__VA_ARGS__) PIPIT_INTEGER_CASES(__VA_ARGS__) \
                         PIPIT_DTYPE_CASE(::pipit::DType::b8, bool, __VA_ARGS__)     \
                             PIPIT_HALF_CASES(HALF, BFLOAT, __VA_ARGS__))
