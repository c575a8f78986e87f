#pragma once
// CUDA devices as pipit sees them. Without a driver or a GPU these report zero devices rather
// than failing, so a build with CUDA runs everywhere and its CUDA tests can skip.
#include "tensor/cpu/cpu_allocator.h"

namespace pipit::cuda {

int device_count();
bool is_available();

// Makes `index` the calling thread's current device for its lifetime, restoring the previous
// one after. Every backend op holds one, so tensors on cuda:1 run on cuda:1 whatever the
// thread's current device was.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int index_;
};

// The caching allocator (cuda_allocator.cpp). Released blocks stay in size-class free lists
// and are handed out again, because cudaMalloc and cudaFree synchronise the device. All work
// runs on the legacy default stream, so a block reused by a later op is ordered after every
// op that used it before.
std::shared_ptr<Storage> allocate(int device, size_t nbytes);
// `reserved` counts cached free bytes, as for the CPU allocator.
MemoryStats memory_stats(int device);
void reset_peak_memory(int device);
// Returns every cached block of `device` to the driver.
void empty_cache(int device);

}  // namespace pipit::cuda
