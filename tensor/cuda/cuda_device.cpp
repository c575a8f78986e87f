#include "tensor/cuda/cuda_device.h"

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_check.h"

namespace pipit::cuda {

int device_count() {
  // No driver, no device or a driver too old all come back as errors here; each means "no
  // usable device", never a reason to abort. The error is cleared so it does not stick.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

bool is_available() {
  return device_count() > 0;
}

int current_device() {
  int device = 0;
  PIPIT_CUDA_CHECK("cuda device", cudaGetDevice(&device));
  return device;
}

DeviceGuard::DeviceGuard(int index) : previous_(index), index_(index) {
  PIPIT_CHECK(index >= 0 && index < device_count(), "cuda: device cuda:", index,
              " does not exist (", device_count(), " CUDA devices present)");
  PIPIT_CUDA_CHECK("cuda device", cudaGetDevice(&previous_));
  if (previous_ != index_) PIPIT_CUDA_CHECK("cuda device", cudaSetDevice(index_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != index_) {
    cudaSetDevice(previous_);
    cudaGetLastError();  // a destructor cannot report it; it must not stick to the next op
  }
}

namespace {

thread_local bool capturing_now = false;

// A capture in a strict mode (another library's, or a thread's own) fails at a cudaMalloc,
// which no graph records; the allocator's blocks outlive any capture, so allocating is safe.
cudaError_t malloc_block(void** data, size_t size) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t status = cudaMalloc(data, size);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return status;
}

// Sizes round up to 512 bytes (cudaMalloc's own granularity), then above 1 MiB to one of 8
// classes per power of two, so a block is at most 1/8 too big and classes stay few.
size_t size_class(size_t nbytes) {
  size_t n = (std::max<size_t>(nbytes, 1) + 511) / 512 * 512;
  if (n < (size_t{1} << 20)) return n;
  const size_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

// A cached block. `ready` holds events recorded on the other streams that used the block
// before it was released: the owner's next user waits for them before touching the memory.
struct Block {
  void* data = nullptr;
  std::vector<cudaEvent_t> ready;
};

// Free lists are per (stream, size): a block freed by the stream that allocated it can go to
// that stream's next request at once, because the stream runs its ops in order.
using FreeKey = std::pair<void*, size_t>;

struct Cache {
  std::mutex mutex;
  std::map<FreeKey, std::vector<Block>> free_blocks;
  // Live blocks that record_stream marked as used on streams other than their owner.
  std::unordered_map<void*, std::vector<void*>> used_on;
  std::set<void*> kept_streams;
  // Bumped as a stream is destroyed: a block whose stream's generation moved on since it was
  // allocated outlived its stream, and is released to the default stream's lists instead
  // (the driver may already have given the handle to a new stream).
  std::unordered_map<void*, uint64_t> generations;
  MemoryStats stats;
};

Cache& cache(int device) {
  // Never destroyed: tensors may outlive static teardown, and by then the driver may be gone.
  static auto* mutex = new std::mutex;
  static auto* caches = new std::unordered_map<int, Cache*>;
  std::lock_guard<std::mutex> lock(*mutex);
  Cache*& c = (*caches)[device];
  if (!c) c = new Cache();
  return *c;
}

// Frees the cached blocks of every stream `which` selects even when a call fails, so none is
// freed twice later; returns the first failure. The caller holds c.mutex.
template <typename Which>
cudaError_t free_blocks_of(Cache& c, Which which) {
  cudaError_t first = cudaSuccess;
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end();) {
    if (!which(it->first.first)) {
      ++it;
      continue;
    }
    for (const Block& b : it->second) {
      for (cudaEvent_t e : b.ready) {
        const cudaError_t status = cudaEventDestroy(e);
        if (first == cudaSuccess) first = status;
      }
      const cudaError_t status = cudaFree(b.data);
      if (first == cudaSuccess) first = status;
      c.stats.reserved -= it->first.second;
    }
    it = c.free_blocks.erase(it);
  }
  cudaGetLastError();
  return first;
}

// Every stream's cached blocks but a live graph's; then reports the first failure.
void free_cached(int device, Cache& c) {
  DeviceGuard guard(device);
  const cudaError_t first =
      free_blocks_of(c, [&](void* stream) { return c.kept_streams.count(stream) == 0; });
  if (first != cudaSuccess) throw_cuda_error("empty_cache", "cudaFree", first);
}

// Makes `stream` wait for `event`; a failure falls back to waiting on the host, which orders
// just as well. Never throws, so a popped block cannot be lost.
void wait_for(cudaStream_t stream, cudaEvent_t event) noexcept {
  if (cudaStreamWaitEvent(stream, event, 0) != cudaSuccess) cudaEventSynchronize(event);
  cudaEventDestroy(event);
  cudaGetLastError();
}

// Runs in Storage's deleter, so it must not throw. The block gets an event on every stream
// other than its owner that used it (the releasing thread's, and those record_stream named);
// if even that fails, the device is synchronised so the block is idle before anyone reuses it.
void release(Cache& c, int device, void* owner_stream, uint64_t generation, void* data,
             size_t size) noexcept {
  std::vector<void*> streams;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (auto it = c.used_on.find(data); it != c.used_on.end()) {
      streams = std::move(it->second);
      c.used_on.erase(it);
    }
  }
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                        cudaSetDevice(device) == cudaSuccess;
  // A stream capturing into a graph is skipped: the graph's work is not queued yet, and an
  // event recorded into a capture cannot be waited on outside it.
  if (!capturing()) streams.push_back(current_stream_handle(device));
  Block block{data, {}};
  bool failed = false;
  for (void* stream : streams) {
    if (stream == owner_stream) continue;
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      failed = true;
      break;
    }
    block.ready.push_back(event);
    if (cudaEventRecord(event, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      failed = true;
      break;
    }
  }
  if (failed) {
    for (cudaEvent_t e : block.ready) cudaEventDestroy(e);
    block.ready.clear();
    cudaDeviceSynchronize();
  }
  if (switched) cudaSetDevice(previous);
  cudaGetLastError();
  std::lock_guard<std::mutex> lock(c.mutex);
  // A stream finishes all its work before it is destroyed: nothing there to wait for.
  if (owner_stream && c.generations[owner_stream] != generation) owner_stream = nullptr;
  c.stats.allocated -= size;
  c.free_blocks[{owner_stream, size}].push_back(std::move(block));
  c.stats.reserved += size;
}

}  // namespace

bool capturing() {
  return capturing_now;
}

void set_capturing(bool on) {
  capturing_now = on;
}

void record_stream(const Storage& storage, void* stream) {
  const int device = storage.device().index;
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<void*>& streams = c.used_on[storage.data()];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
}

std::shared_ptr<Storage> allocate(int device, size_t nbytes) {
  const size_t size = size_class(nbytes);
  Cache& c = cache(device);
  DeviceGuard guard(device);
  void* stream = current_stream_handle(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  const uint64_t generation = c.generations[stream];
  void* data = nullptr;
  std::vector<Block>* cached = nullptr;
  auto found = std::vector<Block>::reverse_iterator();
  if (auto it = c.free_blocks.find({stream, size}); it != c.free_blocks.end()) {
    // The last released first, as its bytes may still be in L2. A capture cannot wait for
    // events recorded outside it: it takes only blocks without any.
    cached = &it->second;
    found = std::find_if(cached->rbegin(), cached->rend(),
                         [](const Block& b) { return !capturing() || b.ready.empty(); });
  }
  if (cached && found != cached->rend()) {
    Block block = std::move(*found);
    cached->erase(std::next(found).base());
    c.stats.reserved -= size;
    data = block.data;
    for (cudaEvent_t e : block.ready) wait_for(static_cast<cudaStream_t>(stream), e);
  } else if (const cudaError_t first = malloc_block(&data, size); first != cudaSuccess) {
    cudaGetLastError();
    auto out_of_memory = [&](cudaError_t status) {
      return Error(detail::concat("allocate: out of memory on cuda:", device, " allocating ",
                                  nbytes, " bytes (", c.stats.allocated, " bytes held by tensors; ",
                                  cudaGetErrorString(status), ")"));
    };
    // The cache cannot be emptied inside a capture: cudaFree waits for the device.
    if (capturing()) throw out_of_memory(first);
    // Cached blocks of other sizes or streams may be what the device is missing: give them
    // back (cudaFree waits for the device to be idle), retry.
    free_cached(device, c);
    if (const cudaError_t status = cudaMalloc(&data, size); status != cudaSuccess) {
      cudaGetLastError();
      throw out_of_memory(status);
    }
  }
  c.stats.allocated += size;
  c.stats.peak_allocated = std::max(c.stats.peak_allocated, c.stats.allocated);
  Cache* owner = &c;
  return std::make_shared<Storage>(data, nbytes, Device::cuda(device),
                                   [owner, device, stream, generation, size](void* p) {
                                     release(*owner, device, stream, generation, p, size);
                                   });
}

MemoryStats memory_stats(int device) {
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void reset_peak_memory(int device) {
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.peak_allocated = c.stats.allocated;
}

void empty_cache(int device) {
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  free_cached(device, c);
}

void keep_stream_blocks(int device, void* stream) {
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  c.kept_streams.insert(stream);
}

void forget_stream_blocks(int device, void* stream) noexcept {
  Cache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  c.kept_streams.erase(stream);
  ++c.generations[stream];
  for (auto& [data, streams] : c.used_on) std::erase(streams, stream);
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                        cudaSetDevice(device) == cudaSuccess;
  free_blocks_of(c, [&](void* s) { return s == stream; });
  if (switched) cudaSetDevice(previous);
  cudaGetLastError();
}

}  // namespace pipit::cuda
