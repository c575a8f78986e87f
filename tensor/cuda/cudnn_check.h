#pragma once
// Every cuDNN call goes through PIPIT_CUDNN_CHECK, as CUDA and cuBLAS calls go through
// cuda_check.h: a failure becomes a pipit::Error naming the pipit op, the call, cuDNN's status
// and, where cuDNN logged one, its own account of what was wrong.
#include <cudnn.h>

#include "tensor/error.h"

namespace pipit::cuda {

[[noreturn]] inline void throw_cudnn_error(const char* op, const char* call, cudnnStatus_t status) {
  char message[512] = {};
  cudnnGetLastErrorString(message, sizeof(message));
  throw Error(detail::concat(op, ": ", call, " failed: ", cudnnGetErrorString(status),
                             message[0] != '\0' ? " (" : "", message,
                             message[0] != '\0' ? ")" : ""));
}

}  // namespace pipit::cuda

// PIPIT_CUDNN_CHECK("conv2d", cudnnConvolutionForward(...)) throws naming "conv2d" and the call.
#define PIPIT_CUDNN_CHECK(op, call)                               \
  do {                                                            \
    const cudnnStatus_t pipit_status_ = (call);                   \
    if (pipit_status_ != CUDNN_STATUS_SUCCESS) {                  \
      ::pipit::cuda::throw_cudnn_error(op, #call, pipit_status_); \
    }                                                             \
  } while (0)
