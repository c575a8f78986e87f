#pragma once
// One cuDNN handle per device, shared by the ops that call cuDNN (convolutions, attention).
#include <cudnn.h>

#include <mutex>

namespace pipit::cuda {

// Created on first use and never destroyed (the driver may be gone by static teardown). A
// handle must not be used from two threads at once: hold `mutex` while using it.
struct DnnHandle {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
};

// `op` names the caller in the error if creating the handle fails.
DnnHandle& dnn_handle(const char* op, int device);

// Points the handle at the calling thread's current stream on `device`; call with its mutex
// held, before every use (another thread may have pointed it elsewhere).
void use_current_stream(const char* op, DnnHandle& dnn, int device);

}  // namespace pipit::cuda
