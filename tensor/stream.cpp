#include "tensor/stream.h"

#include <map>

#include "tensor/error.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/index_check.h"
#endif

namespace pipit {
namespace {

// This thread's current stream per CUDA device; absent means the default stream.
thread_local std::map<int, void*> current_streams;

}  // namespace

#ifdef PIPIT_WITH_CUDA
namespace cuda {

void* current_stream_handle(int device) {
  auto it = current_streams.find(device);
  return it == current_streams.end() ? nullptr : it->second;
}

}  // namespace cuda
#endif

Stream Stream::default_stream(Device device) {
  return Stream(device, nullptr);
}

Stream Stream::create(Device device) {
  // A blocking stream: it still orders itself with the legacy default stream, so code that
  // never names a stream (the coordinator's loss, a test) sees every stage's finished work.
  return make(device, true);
}

Stream Stream::create_independent(Device device) {
  return make(device, false);
}

Stream Stream::make(Device device, [[maybe_unused]] bool blocking) {
  if (device.is_cpu()) return Stream(device, nullptr);
#ifdef PIPIT_WITH_CUDA
  cuda::DeviceGuard guard(device.index);
  cudaStream_t stream = nullptr;
  PIPIT_CUDA_CHECK("stream", cudaStreamCreateWithFlags(
                                 &stream, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  const int index = device.index;
  // The stream's work finishes first; then what pipit keeps per stream goes (its cuBLAS
  // workspace, index checks and cached blocks), so none of it passes to a new stream that the
  // driver gives the same handle.
  return Stream(device, std::shared_ptr<void>(stream, [index](void* s) {
                  int previous = 0;
                  cudaGetDevice(&previous);
                  cudaSetDevice(index);
                  cudaStreamSynchronize(static_cast<cudaStream_t>(s));
                  cuda::forget_blas_workspace(index, s);
                  cuda::forget_index_checks(index, s);
                  cuda::forget_stream_blocks(index, s);
                  cudaStreamDestroy(static_cast<cudaStream_t>(s));
                  cudaSetDevice(previous);
                  cudaGetLastError();  // unreportable here; it must not stick to the next op
                }));
#else
  throw Error("stream: device " + device.str() +
              " is not available: pipit was built without CUDA (PIPIT_CUDA=OFF or no nvcc)");
#endif
}

void Stream::synchronize() const {
  if (device_.is_cpu()) return;
#ifdef PIPIT_WITH_CUDA
  cuda::DeviceGuard guard(device_.index);
  PIPIT_CUDA_CHECK("synchronize", cudaStreamSynchronize(static_cast<cudaStream_t>(handle())));
  cuda::raise_index_faults(handle());
#endif
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream::default_stream(device);
  auto it = current_streams.find(device.index);
  if (it == current_streams.end() || it->second == nullptr) return Stream::default_stream(device);
  // The guard that installed it holds the owning Stream; this copy only borrows the handle.
  return Stream(device, std::shared_ptr<void>(it->second, [](void*) {}));
}

StreamGuard::StreamGuard(const Stream& stream) : stream_(stream), previous_(nullptr) {
  if (stream_.device().is_cpu()) return;
  auto it = current_streams.find(stream_.device().index);
  if (it != current_streams.end()) previous_ = it->second;
  current_streams[stream_.device().index] = stream_.handle();
}

StreamGuard::~StreamGuard() {
  if (stream_.device().is_cpu()) return;
  current_streams[stream_.device().index] = previous_;
}

void record_stream(const Tensor& tensor, const Stream& stream) {
  if (!tensor.device().is_cuda() || tensor.device() != stream.device()) return;
#ifdef PIPIT_WITH_CUDA
  cuda::record_stream(*tensor.storage(), stream.handle());
#endif
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#ifdef PIPIT_WITH_CUDA
  cuda::DeviceGuard guard(device.index);
  PIPIT_CUDA_CHECK("synchronize", cudaDeviceSynchronize());
  cuda::raise_device_index_faults();
#endif
}

}  // namespace pipit
