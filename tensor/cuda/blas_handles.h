#pragma once
// cuBLAS and cuBLASLt handles for the matrix products (cuda_backend.cpp): one of each per
// device, created on first use and never destroyed (the driver may be gone by static
// teardown). Calls only enqueue work, so serialising them costs little, and a handle must not
// be used from two threads at once.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "tensor/storage.h"

namespace pipit::cuda {

// What cuBLASLt's heuristic is asked about a product (lt_matmul): sizes, leading dims,
// transposes, dtypes, compute type, epilogue, the operands', GELU input's and bias's
// alignments, and the batch count.
using LtKey = std::array<int64_t, 17>;

struct Blas {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  // Its answers, none where it had no algorithm.
  std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> lt_algorithms;
  // A workspace per stream: GEMMs queued on two streams at once must not share one, and
  // cublasSetStream resets the handle's workspace to the library's default pool.
  std::map<void*, std::shared_ptr<Storage>> workspaces;
  Blas() = default;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // Runs only for one whose creation failed partway: complete ones are never destroyed.
  ~Blas() {
    if (lt) cublasLtDestroy(lt);
    if (handle) cublasDestroy(handle);
  }
};

// cuBLAS's recommended workspace for Hopper (and more than enough for Ampere).
inline constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

// The device's handles with the calling thread's stream and that stream's workspace, locked
// for as long as this lives.
struct BoundBlas {
  std::unique_lock<std::mutex> lock;
  Blas& blas;
  cudaStream_t stream;
  void* workspace;
};
BoundBlas bind_blas(int device);

}  // namespace pipit::cuda
