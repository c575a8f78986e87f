#pragma once
// Shared by the [cuda] test files: the visible skip without a device, and poisoned outputs.
#include <catch2/catch.hpp>
#include <limits>
#include <string>

#include "pipit.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#endif

// Inline, so a [cuda] test file can take every helper here with one using-directive.
namespace pipit::testing {
inline namespace cuda_testing {

inline const pipit::Device kCuda = pipit::Device::cuda(0);
inline const pipit::Device kCpu = pipit::Device::cpu();

// True when the test can run; otherwise records a visible skip.
inline bool cuda_ready() {
#ifdef PIPIT_WITH_CUDA
  if (pipit::cuda::is_available()) return true;
  WARN("skipped: no CUDA device");
#else
  WARN("skipped: pipit was built without CUDA");
#endif
  return false;
}

// Prints what a GPU case measured, whether or not it passes, so that each bound can state the
// value it was set from (gpu_check.sh and gpu_quick.sh keep the lines).
inline void measured(const std::string& what, double value) {
  WARN("measured: " << what << " = " << value);
}

// An output on `device` filled with a value no kernel produces, so unwritten elements show.
inline pipit::Tensor poisoned(const pipit::Shape& shape, pipit::DType dtype, pipit::Device device) {
  pipit::Tensor t = pipit::Tensor::empty(shape, dtype, device);
  const double poison = pipit::is_floating(dtype)   ? std::numeric_limits<double>::quiet_NaN()
                        : dtype == pipit::DType::b8 ? 1.0
                                                    : -987654.0;
  pipit::backend(device).fill(t, poison);
  return t;
}

// Bounds for a CUDA kernel against the CPU where both sum in f64 or f32.
inline double tol_for(pipit::DType dtype) {
  return dtype == pipit::DType::f64 ? 1e-12 : 1e-5;
}

inline pipit::Tensor random(const pipit::Shape& shape, pipit::DType dtype, pipit::Generator& g,
                            double low = -2, double high = 2) {
  return pipit::uniform(shape, low, high, &g, {dtype});
}

}  // namespace cuda_testing
}  // namespace pipit::testing
