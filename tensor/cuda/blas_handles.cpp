#include "tensor/cuda/blas_handles.h"

#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"

namespace pipit::cuda {
namespace {

// The device's handles, made on first use unless `existing_only` (then null if not made yet).
Blas* find_blas(int device, bool existing_only) {
  // Never destroyed, like the handles: a stream may be destroyed during static teardown.
  static auto* mutex = new std::mutex;
  static auto* handles = new std::vector<Blas*>;
  std::lock_guard<std::mutex> lock(*mutex);
  if (handles->empty()) handles->resize(static_cast<size_t>(cuda::device_count()), nullptr);
  Blas*& b = handles->at(static_cast<size_t>(device));
  if (!b && !existing_only) {
    // Kept only once complete, so a failure here is raised again by the next call.
    auto fresh = std::make_unique<Blas>();
    PIPIT_CUBLAS_CHECK("matmul", cublasCreate(&fresh->handle));
    // TF32 is chosen per call through the compute type, never by the handle's math mode.
    PIPIT_CUBLAS_CHECK("matmul", cublasSetMathMode(fresh->handle, CUBLAS_DEFAULT_MATH));
    PIPIT_CUBLAS_CHECK("matmul", cublasLtCreate(&fresh->lt));
    b = fresh.release();
  }
  return b;
}

Blas& blas(int device) {
  return *find_blas(device, false);
}

}  // namespace

BoundBlas bind_blas(int device) {
  Blas& h = blas(device);
  std::unique_lock<std::mutex> lock(h.mutex);
  void* stream = cuda::current_stream_handle(device);
  std::shared_ptr<Storage>& workspace = h.workspaces[stream];
  if (!workspace) workspace = cuda::allocate(device, kBlasWorkspaceBytes);
  PIPIT_CUBLAS_CHECK("matmul", cublasSetStream(h.handle, static_cast<cudaStream_t>(stream)));
  PIPIT_CUBLAS_CHECK("matmul",
                     cublasSetWorkspace(h.handle, workspace->data(), kBlasWorkspaceBytes));
  return {std::move(lock), h, static_cast<cudaStream_t>(stream), workspace->data()};
}

void forget_blas_workspace(int device, void* stream) noexcept {
  // Released after the lock: the allocator takes locks of its own.
  std::shared_ptr<Storage> workspace;
  try {
    Blas* h = find_blas(device, true);
    if (!h) return;
    std::lock_guard<std::mutex> lock(h->mutex);
    if (auto it = h->workspaces.find(stream); it != h->workspaces.end()) {
      workspace = std::move(it->second);
      h->workspaces.erase(it);
    }
  } catch (const std::exception&) {
    // The device index is out of range: no workspace was given out for it.
  }
}

}  // namespace pipit::cuda
