#include "train/gpu_peak.h"

#ifdef PIPIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pipit {

std::optional<double> dense_peak_flops(const std::string& name, const std::string& dtype) {
  struct Peak {
    const char* name;  // found in CUDA's device name
    double half_tflops, tf32_tflops;
  };
  // SXM parts' dense tensor-core peaks (NVIDIA's datasheets); PCIe cards run lower.
  static const Peak peaks[] = {
      {"H200", 989, 494}, {"H100", 989, 494}, {"A100", 312, 156}, {"L40S", 362, 183}};
  for (const Peak& peak : peaks) {
    if (name.find(peak.name) == std::string::npos) continue;
    return (dtype == "f32" ? peak.tf32_tflops : peak.half_tflops) * 1e12;
  }
  return std::nullopt;
}

std::optional<double> cuda_dense_peak_flops([[maybe_unused]] int index,
                                            [[maybe_unused]] const std::string& dtype) {
#ifdef PIPIT_WITH_CUDA
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return std::nullopt;
  return dense_peak_flops(properties.name, dtype);
#else
  return std::nullopt;
#endif
}

}  // namespace pipit
