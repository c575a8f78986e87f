#include "tensor/cpu/cpu_allocator.h"

#include <bit>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/error.h"

namespace pipit {
namespace {

constexpr size_t kCacheFrom = 64 * 1024;
constexpr size_t kMaxCached = size_t{1} << 31;

// Sizes round up to one of 8 classes per power of two, so a block is at most 1/8 too big.
size_t size_class(size_t nbytes) {
  size_t n = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
  if (n < kCacheFrom) return n;
  const size_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

struct Cache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;
};

Cache& cache() {
  static Cache* instance = new Cache();  // never destroyed: tensors may outlive static teardown
  return *instance;
}

#ifdef PIPIT_SANITIZE
constexpr bool kCaching = false;  // reuse would hide use-after-free from AddressSanitizer
#else
constexpr bool kCaching = true;
#endif

void release(void* data, size_t size) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.allocated -= size;
  if (kCaching && size >= kCacheFrom && c.stats.reserved + size <= kMaxCached) {
    c.free_blocks[size].push_back(data);
    c.stats.reserved += size;
    return;
  }
  std::free(data);
}

}  // namespace

std::shared_ptr<Storage> cpu_allocate(size_t nbytes) {
  const size_t size = size_class(nbytes);
  Cache& c = cache();
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      c.stats.reserved -= size;
    }
    c.stats.allocated += size;
    c.stats.peak_allocated = std::max(c.stats.peak_allocated, c.stats.allocated);
  }
  if (!data) data = std::aligned_alloc(64, size);
  if (!data) {
    release(nullptr, size);
    throw Error("allocate: out of memory allocating " + std::to_string(nbytes) + " bytes");
  }
  return std::make_shared<Storage>(data, nbytes, Device::cpu(),
                                   [size](void* p) { release(p, size); });
}

MemoryStats cpu_memory_stats() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().stats;
}

void reset_cpu_peak_memory() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().stats.peak_allocated = cache().stats.allocated;
}

void cpu_empty_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [size, blocks] : c.free_blocks) {
    for (void* p : blocks) std::free(p);
  }
  c.free_blocks.clear();
  c.stats.reserved = 0;
}

}  // namespace pipit
