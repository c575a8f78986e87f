#include "tensor/cuda/host_staging.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"

namespace pipit::cuda {
namespace {

constexpr size_t kChunk = size_t{4} << 20;

// A pinned buffer and the event recorded after the last transfer that used it; nobody writes
// into the buffer before that event has completed.
struct Buffer {
  void* data = nullptr;
  cudaEvent_t done = nullptr;
  bool pending = false;

  void wait() {
    if (pending) PIPIT_CUDA_CHECK("copy", cudaEventSynchronize(done));
    pending = false;
  }
};

// Buffers per device (events belong to a device), handed to one copy at a time and never
// freed: pinned memory is scarce to allocate, cheap to keep.
struct Pool {
  std::mutex mutex;
  std::vector<Buffer*> idle;
};

Pool& pool(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, Pool*> pools;
  std::lock_guard<std::mutex> lock(mutex);
  Pool*& p = pools[device];
  if (!p) p = new Pool();
  return *p;
}

// Two buffers for one copy, returned to the pool when it ends.
class Lease {
 public:
  explicit Lease(int device) : pool_(pool(device)) {
    std::lock_guard<std::mutex> lock(pool_.mutex);
    for (Buffer*& b : buffers_) {
      if (!pool_.idle.empty()) {
        b = pool_.idle.back();
        pool_.idle.pop_back();
      }
    }
    for (Buffer*& b : buffers_) {
      if (b) continue;
      b = new Buffer();
      PIPIT_CUDA_CHECK("copy", cudaHostAlloc(&b->data, kChunk, cudaHostAllocPortable));
      PIPIT_CUDA_CHECK("copy", cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming));
    }
  }
  ~Lease() {
    std::lock_guard<std::mutex> lock(pool_.mutex);
    for (Buffer* b : buffers_) pool_.idle.push_back(b);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Buffer& operator[](size_t i) { return *buffers_[i % 2]; }

 private:
  Pool& pool_;
  Buffer* buffers_[2] = {nullptr, nullptr};
};

cudaStream_t stream_of(int device) {
  return static_cast<cudaStream_t>(current_stream_handle(device));
}

// A graph would record the copy out of a staging buffer the host refills at once, and no
// replay can wait for the host.
void refuse_while_capturing(const char* direction) {
  PIPIT_CHECK(!capturing(), "copy: a ", direction,
              " copy inside cuda::Graph::capture cannot be replayed; copy new inputs into the "
              "captured tensors before replay(), and read results after it");
}

}  // namespace

void copy_host_to_device(void* dst, const void* src, size_t nbytes) {
  refuse_while_capturing("host-to-device");
  const int device = current_device();
  const cudaStream_t stream = stream_of(device);
  Lease lease(device);
  for (size_t offset = 0, i = 0; offset < nbytes; offset += kChunk, ++i) {
    const size_t n = std::min(kChunk, nbytes - offset);
    Buffer& b = lease[i];
    b.wait();
    std::memcpy(b.data, static_cast<const char*>(src) + offset, n);
    PIPIT_CUDA_CHECK("copy", cudaMemcpyAsync(static_cast<char*>(dst) + offset, b.data, n,
                                             cudaMemcpyHostToDevice, stream));
    PIPIT_CUDA_CHECK("copy", cudaEventRecord(b.done, stream));
    b.pending = true;
  }
}

void copy_device_to_host(void* dst, const void* src, size_t nbytes) {
  refuse_while_capturing("device-to-host");
  const int device = current_device();
  const cudaStream_t stream = stream_of(device);
  Lease lease(device);
  // Chunk i is in flight while chunk i - 1 is copied out of its buffer on the host.
  auto drain = [&](size_t i) {
    const size_t offset = i * kChunk;
    Buffer& b = lease[i];
    b.wait();
    std::memcpy(static_cast<char*>(dst) + offset, b.data, std::min(kChunk, nbytes - offset));
  };
  const size_t chunks = (nbytes + kChunk - 1) / kChunk;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t offset = i * kChunk;
    Buffer& b = lease[i];
    b.wait();
    PIPIT_CUDA_CHECK(
        "copy", cudaMemcpyAsync(b.data, static_cast<const char*>(src) + offset,
                                std::min(kChunk, nbytes - offset), cudaMemcpyDeviceToHost, stream));
    PIPIT_CUDA_CHECK("copy", cudaEventRecord(b.done, stream));
    b.pending = true;
    if (i > 0) drain(i - 1);
  }
  if (chunks > 0) drain(chunks - 1);
}

}  // namespace pipit::cuda
