#pragma once
// Branch-free float math that GCC vectorizes inside plain loops. libm's expf and tanhf are
// scalar calls (about 10 ns each), which made GELU and softmax the costliest non-GEMM kernels of
// a GPT step. Double keeps libm: it is the dtype of the gradient checks, not of training.
// Everything here is [[gnu::always_inline]]: called out of line, the loops around it would not
// vectorize.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace pipit::cpu {

// e^x within 1 ulp over the whole float range: +-inf, 0 below -104 (denormals down to there)
// and NaN behave as std::exp does. Cephes' reduction x = n ln2 + r, |r| <= ln2 / 2, and its
// degree-5 polynomial; 2^n is applied in two halves so that no partial scale leaves the
// normal range.
[[gnu::always_inline]] inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Comparisons with NaN are false, so NaN flows through to the result.
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 88.8f ? 88.8f : xc;
  const float shifted = xc * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  return p * std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23) *
         std::bit_cast<float>(static_cast<uint32_t>(n2 + 127) << 23);
}

template <typename T>
[[gnu::always_inline]] inline T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_exp(x);
  } else {
    return std::exp(x);
  }
}

// sigmoid and tanh from e = e^-|x| <= 1, so nothing overflows: sigmoid is 1 / (1 + e) or
// e / (1 + e) by the sign of x. tanh|x| = (1 - e) / (1 + e) with e = e^-2|x| loses relative
// accuracy as |x| -> 0, where Cephes' odd polynomial takes over (below 0.625).
template <typename T>
[[gnu::always_inline]] inline T sigmoid(T x) {
  const T e = exp_of(-std::abs(x));
  const T q = T(1) / (T(1) + e);
  return x >= T(0) ? q : e * q;
}

[[gnu::always_inline]] inline float fast_tanh(float x) {
  const float a = std::abs(x);
  const float e = fast_exp(-2.0f * a);
  const float large = (1.0f - e) / (1.0f + e);
  const float z = a * a;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * a + a;
  const float t = a > 0.625f ? large : small;  // NaN takes the polynomial and stays NaN
  return x < 0.0f ? -t : t;
}

template <typename T>
[[gnu::always_inline]] inline T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_tanh(x);
  } else {
    return std::tanh(x);
  }
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

// GELU, tanh form: 0.5 x (1 + tanh(u)) is x * sigmoid(2u). With e = exp(-|2u|) <= 1 the
// sigmoid is 1 / (1 + e) or e / (1 + e) and s (1 - s) is e / (1 + e)^2, so nothing overflows
// or cancels, and the float path needs only the vectorizable exp.
template <typename T>
struct GeluTerms {
  T s, s_one_minus_s;
};

template <typename T>
[[gnu::always_inline]] inline GeluTerms<T> gelu_terms(T x) {
  const T z = T(2 * kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
  const T e = exp_of(-std::abs(z));
  const T q = T(1) / (T(1) + e);
  return {z >= T(0) ? q : e * q, e * q * q};
}

template <typename T>
[[gnu::always_inline]] inline T gelu(T x) {
  return x * gelu_terms(x).s;
}

template <typename T>
[[gnu::always_inline]] inline T gelu_derivative(T x) {
  const GeluTerms<T> t = gelu_terms(x);
  const T dz = T(2 * kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
  return t.s + x * t.s_one_minus_s * dz;
}

// Loops over contiguous floats (tensor/cpu/vec_kernels.cpp), compiled for AVX-512, AVX2 and the
// baseline ISA and picked when the program loads. No build contracts to FMA, so all do the
// same IEEE operations and give identical bits on any x86-64 machine.
void exp_shifted_row(const float* x, float shift, float* y, int64_t n);  // y = e^(x - shift)
void gelu_row(const float* x, float* y, int64_t n);
void gelu_backward_row(const float* grad, const float* x, float* y, int64_t n);
void sigmoid_row(const float* x, float* y, int64_t n);
void tanh_row(const float* x, float* y, int64_t n);
// GELU of bf16 by table: bf16_gelu_table() holds GELU of every bf16 value rounded to bf16, and
// bf16_gelu_derivative_table() its derivative in f32, each built once by the two rows above, so
// that y = table[x] and y = grad * derivative[x], rounded, are the computed path's bits.
const uint16_t* bf16_gelu_table();
const float* bf16_gelu_derivative_table();
void gelu_bf16_row(const uint16_t* table, const uint16_t* x, uint16_t* y, int64_t n);
void gelu_backward_bf16_row(const float* derivative, const uint16_t* grad, const uint16_t* x,
                            uint16_t* y, int64_t n);
// bf16 bits to f32 (exact) and back (float_to_bfloat16's rounding), the casts of autocast.
void widen_bf16_row(const uint16_t* x, float* y, int64_t n);
void round_bf16_row(const float* x, uint16_t* y, int64_t n);
// c[m, n] = beta c[m, n] + sum_k a[m, k] bt[n, k] for columns n in [n0, n1) and rows m in
// [0, M), with a f32 [M, K] (row stride K) and bt a weight [N, K] (row stride ldb), f32 or
// bf16 bits, each sum in lane_sum's order: a product of few rows by a weight, read once.
void weight_columns(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* a, const float* bt,
                    int64_t ldb, float beta, float* c, int64_t ldc);
void weight_columns(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* a,
                    const uint16_t* bt, int64_t ldb, float beta, float* c, int64_t ldc);

// y = e^(x - shift) over n elements: the vectorised row above for float, libm for double.
inline void exp_shifted(const float* x, float shift, float* y, int64_t n) {
  exp_shifted_row(x, shift, y, n);
}
inline void exp_shifted(const double* x, double shift, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

// sum of term(i) over [0, n) in kLanes interleaved partial sums added in a fixed tree. It
// vectorizes, where one running sum cannot, and like a running sum its rounding depends only
// on n, never on how work is split across threads.
template <typename T, typename Term>
[[gnu::always_inline]] inline T lane_sum(int64_t n, Term term) {
  constexpr int kLanes = 8;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  }
  for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// max of x[0, n), n >= 1, in lanes as lane_sum; NaNs may be skipped, callers see them later.
template <typename T>
[[gnu::always_inline]] inline T lane_max(const T* x, int64_t n) {
  constexpr int kLanes = 8;
  T acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  }
  for (int j = 0; i + j < n; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  T m = acc[0];
  for (int j = 1; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

}  // namespace pipit::cpu
