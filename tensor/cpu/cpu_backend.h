#pragma once
#include "tensor/backend.h"

namespace pipit {

// The CPU implementation of every raw kernel: OpenMP loops, and GEMM from oneDNN or OpenBLAS
// (cpu_gemm_provider()). Its methods are defined across tensor/cpu/*.cpp, one family of
// kernels per file.
class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  // Every op of PIPIT_BACKEND_OPS (tensor/backend.h).
  PIPIT_BACKEND_OPS(PIPIT_BACKEND_OVERRIDE)
};

// Where f32 GEMMs on the CPU go. automatic, when the build has oneDNN (CMake PIPIT_GEMM;
// =ONEDNN makes it oneDNN for every product): oneDNN on CPUs with AVX-512; on others OpenBLAS,
// but oneDNN for small products (up to 2^20 multiply-adds); tensor/cpu/matmul.cpp says why.
// f64 products always go to OpenBLAS. Choosing oneDNN in a build without it throws. Results
// do not depend on the thread count with either.
enum class GemmProvider { automatic, onednn, openblas };
void set_cpu_gemm_provider(GemmProvider provider);
// The provider in use: "oneDNN", "OpenBLAS" or "OpenBLAS, oneDNN for small products".
const char* cpu_gemm_provider();

// Products of two bf16 operands (autocast's) run on the CPU's AVX512_BF16 dot product where it
// has one (Zen 4 and later, Sapphire Rapids and later): f32 sums of exact products, twice the
// multiply-adds per instruction of f32. Elsewhere, or after set_cpu_bf16_dot(false), they widen
// to f32 (exactly) and take the f32 GEMM: the same results up to the order of the sums, slower.
void set_cpu_bf16_dot(bool enabled);
// Whether bf16 products use the dot product now: the CPU has it and it is enabled.
bool cpu_bf16_dot();

}  // namespace pipit
