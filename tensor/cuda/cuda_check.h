#pragma once
// Every CUDA runtime and cuBLAS call goes through these macros, so a failure becomes a
// pipit::Error naming the pipit op, the call and CUDA's own description, instead of a
// sticky error surfacing later in an unrelated call.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "tensor/error.h"

namespace pipit::cuda {

[[noreturn]] inline void throw_cuda_error(const char* op, const char* call, cudaError_t status) {
  throw Error(detail::concat(op, ": ", call, " failed: ", cudaGetErrorName(status), " (",
                             cudaGetErrorString(status), ")"));
}

[[noreturn]] inline void throw_cublas_error(const char* op, const char* call,
                                            cublasStatus_t status) {
  throw Error(detail::concat(op, ": ", call, " failed: ", cublasGetStatusName(status), " (",
                             cublasGetStatusString(status), ")"));
}

}  // namespace pipit::cuda

// PIPIT_CUDA_CHECK("softmax", cudaMemcpy(...)) throws naming "softmax" and the call.
#define PIPIT_CUDA_CHECK(op, call)                               \
  do {                                                           \
    const cudaError_t pipit_status_ = (call);                    \
    if (pipit_status_ != cudaSuccess) {                          \
      ::pipit::cuda::throw_cuda_error(op, #call, pipit_status_); \
    }                                                            \
  } while (0)

#define PIPIT_CUBLAS_CHECK(op, call)                               \
  do {                                                             \
    const cublasStatus_t pipit_status_ = (call);                   \
    if (pipit_status_ != CUBLAS_STATUS_SUCCESS) {                  \
      ::pipit::cuda::throw_cublas_error(op, #call, pipit_status_); \
    }                                                              \
  } while (0)

// Kernel launches report configuration errors only through cudaGetLastError.
#define PIPIT_CUDA_CHECK_LAUNCH(op) PIPIT_CUDA_CHECK(op, cudaGetLastError())
