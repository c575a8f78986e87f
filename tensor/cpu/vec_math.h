#pragma once
// Branch-free float math that GCC vectorizes inside plain loops. libm's expf and tanhf are
// scalar calls (about 10 ns each), which made GELU and softmax the costliest non-GEMM kernels of
// a GPT step. Double keeps libm: it is the dtype of the gradient checks, not of training.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace pipit::cpu {

// e^x within 1 ulp over the whole float range: +-inf, 0 below -104 (denormals down to there)
// and NaN behave as std::exp does. Cephes' reduction x = n ln2 + r, |r| <= ln2 / 2, and its
// degree-5 polynomial; 2^n is applied in two halves so that no partial scale leaves the
// normal range.
inline float fast_exp(float x) {
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
T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_exp(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace pipit::cpu
