// backend(device): the one place that maps a device to its kernels.
#include "tensor/backend.h"

#include "tensor/cpu/cpu_backend.h"
#ifdef PIPIT_WITH_CUDA
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_device.h"
#endif

namespace pipit {

Backend& backend(Device device) {
  static CpuBackend cpu_backend;
  if (device.is_cpu()) return cpu_backend;
#ifdef PIPIT_WITH_CUDA
  static std::vector<CudaBackend> cuda_backends = [] {
    std::vector<CudaBackend> backends;
    for (int i = 0; i < cuda::device_count(); ++i) backends.emplace_back(i);
    return backends;
  }();
  PIPIT_CHECK(device.index >= 0 && device.index < static_cast<int>(cuda_backends.size()),
              "backend: device ", device, " is not available (", cuda_backends.size(),
              " CUDA devices present)");
  return cuda_backends[static_cast<size_t>(device.index)];
#else
  throw Error("backend: device " + device.str() +
              " is not available: pipit was built without CUDA (PIPIT_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace pipit
