#pragma once
#include "tensor/backend.h"

namespace pipit {

// The CUDA implementation of every raw kernel, one instance per device. Kernels are our own
// except GEMM (cuBLAS); all run on the legacy default stream of the tensor's device, so ops
// are ordered as they are issued and copies back to the host wait for them.
// Methods are defined across tensor/cuda/*: memory, copies and GEMM in cuda_backend.cpp,
// elementwise, random and optimizer kernels in elementwise.cu, reductions and fused nn kernels
// in reduce.cu, convolutions (cuDNN) in conv.cpp, pooling in pool.cu. Either side of a copy
// may be on the CPU: pipit routes every copy touching a CUDA tensor here.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  // Every op of PIPIT_BACKEND_OPS (tensor/backend.h).
  PIPIT_BACKEND_OPS(PIPIT_BACKEND_OVERRIDE)

 private:
  int index_;
};

namespace cuda {
// Called as `stream` (of `device`) is destroyed, after it has finished: releases the cuBLAS
// workspace it was given.
void forget_blas_workspace(int device, void* stream) noexcept;
}  // namespace cuda

}  // namespace pipit
