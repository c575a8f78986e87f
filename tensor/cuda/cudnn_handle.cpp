#include "tensor/cuda/cudnn_handle.h"

#include <memory>
#include <vector>

#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/cudnn_check.h"

namespace pipit::cuda {

DnnHandle& dnn_handle(const char* op, int device) {
  static std::mutex mutex;
  static std::vector<DnnHandle*> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (handles.empty()) handles.resize(static_cast<size_t>(device_count()), nullptr);
  DnnHandle*& slot = handles.at(static_cast<size_t>(device));
  if (!slot) {
    auto fresh = std::make_unique<DnnHandle>();
    PIPIT_CUDNN_CHECK(op, cudnnCreate(&fresh->handle));
    slot = fresh.release();
  }
  return *slot;
}

void use_current_stream(const char* op, DnnHandle& dnn, int device) {
  PIPIT_CUDNN_CHECK(
      op, cudnnSetStream(dnn.handle, static_cast<cudaStream_t>(current_stream_handle(device))));
}

}  // namespace pipit::cuda
