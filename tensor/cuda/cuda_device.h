#pragma once
// CUDA devices as pipit sees them. Without a driver or a GPU these report zero devices rather
// than failing, so a build with CUDA runs everywhere and its CUDA tests can skip.
#include "tensor/cpu/cpu_allocator.h"

namespace pipit::cuda {

int device_count();
bool is_available();
// The calling thread's current device, and its current stream there (a cudaStream_t; null is
// the legacy default stream). Every kernel, cuBLAS and cuDNN call goes to that stream.
int current_device();
void* current_stream_handle(int device);

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

// The caching allocator. Released blocks stay in size-class free lists and are handed out
// again, because cudaMalloc and cudaFree synchronise the device. A block belongs to the stream
// it was allocated on (the thread's current stream) and is reused first by that stream, whose
// ops run in order after every op that used it before; a block released from another stream
// carries an event the next user waits on.
std::shared_ptr<Storage> allocate(int device, size_t nbytes);
// `reserved` counts cached free bytes, as for the CPU allocator.
MemoryStats memory_stats(int device);
void reset_peak_memory(int device);
// Returns every cached block of `device` to the driver.
void empty_cache(int device);
// True while this thread runs a cuda::Graph's capture (cuda_graph.h). What a replay cannot
// repeat refuses then (host copies, random draws), and the allocator's cudaMalloc, which no
// graph records, runs in relaxed capture mode as torch's allocator does.
bool capturing();
// Set and cleared by cuda::Graph::capture only.
void set_capturing(bool on);
// A cuda::Graph's stream: its free blocks are addresses the graph's replays write, so
// empty_cache and the out-of-memory retry leave them alone until forget_stream_blocks.
void keep_stream_blocks(int device, void* stream);
// Called as a stream is destroyed, after it has finished: frees the blocks cached for it, so
// they neither stay reserved nor pass to a new stream that gets the same handle; blocks of it
// still held by tensors go to the default stream's lists when released.
void forget_stream_blocks(int device, void* stream) noexcept;
// Marks `storage` (a CUDA block) as used by work queued on `stream` (a cudaStream_t): when it
// is released, its next user also waits for that work, as torch's record_stream.
void record_stream(const Storage& storage, void* stream);

}  // namespace pipit::cuda
