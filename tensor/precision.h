#pragma once
// Matrix-product precision switches, named as PyTorch names them.
#include <string>

namespace pipit {

// "highest" (the default): f32 matmuls compute in full f32. "high": f32 matmuls on CUDA may
// round their inputs to TF32 (10-bit mantissa) on tensor cores and accumulate in f32, about
// 1e-3 relative error; the CPU always computes in f32. Other strings throw.
void set_float32_matmul_precision(const std::string& precision);
std::string float32_matmul_precision();

}  // namespace pipit
