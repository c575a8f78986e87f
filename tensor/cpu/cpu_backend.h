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

}  // namespace pipit
