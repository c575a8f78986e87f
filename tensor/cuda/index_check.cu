// Index checks queued on a stream and read back only where the host waits anyway (see
// index_check.h). Each stream has kSlots result slots on the device; a check takes the next
// one, a read-back copies the used ones to the host, raises the first failure and resets them.
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/index_check.h"

namespace pipit::cuda {
namespace {

// A check's result: the smallest bad position (kNone if none) and the index found there.
struct Slot {
  unsigned long long position;
  long long value;
};
constexpr unsigned long long kNone = ~0ull;
// Checks one stream may have queued between two read-backs; the next one reads back first.
constexpr size_t kSlots = 1024;

struct StreamChecks {
  Slot* slots = nullptr;  // kSlots on the device, kNone-filled while unused
  std::vector<IndexCheck> queued;
};

std::mutex mutex;

// Never destroyed: a stream may be destroyed during static teardown.
std::map<std::pair<int, void*>, StreamChecks>& checks_by_stream() {
  static auto* checks = new std::map<std::pair<int, void*>, StreamChecks>;
  return *checks;
}

__global__ void find_bad_kernel(const int64_t* idx, int64_t n, int64_t limit, bool use_ignore,
                                int64_t ignore, Slot* slot) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (!(use_ignore && idx[i] == ignore) && (idx[i] < 0 || idx[i] >= limit)) {
      atomicMin(&slot->position, static_cast<unsigned long long>(i));
    }
  }
}

__global__ void record_value_kernel(const int64_t* idx, Slot* slot) {
  if (slot->position != kNone) slot->value = idx[slot->position];
}

cudaError_t reset(Slot* slots, size_t count, cudaStream_t stream) {
  return cudaMemsetAsync(slots, 0xFF, count * sizeof(Slot), stream);
}

// Reads back `stream`'s queued checks (the host has waited for it), forgets them and
// returns the first failure's message, or "" when none failed.
std::string read_back(int device, void* handle) {
  std::vector<Slot> results;
  std::vector<IndexCheck> queued;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = checks_by_stream().find({device, handle});
    if (it == checks_by_stream().end() || it->second.queued.empty()) return "";
    StreamChecks& s = it->second;
    const auto stream = static_cast<cudaStream_t>(handle);
    results.resize(s.queued.size());
    PIPIT_CUDA_CHECK("index check",
                     cudaMemcpyAsync(results.data(), s.slots, results.size() * sizeof(Slot),
                                     cudaMemcpyDeviceToHost, stream));
    PIPIT_CUDA_CHECK("index check", cudaStreamSynchronize(stream));
    queued.swap(s.queued);
    // A failed reset leaves these results to be read again; the fault found now matters more.
    if (reset(s.slots, results.size(), stream) != cudaSuccess) cudaGetLastError();
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].position == kNone) continue;
    const IndexCheck& c = queued[i];
    return detail::concat(c.op, ": ", c.noun, " ", results[i].value, " at ", c.place, " ",
                          results[i].position, " is out of range for ", c.limit, " ", c.unit);
  }
  return "";
}

void raise_for(int device, void* handle) {
  const std::string fault = read_back(device, handle);
  if (!fault.empty()) throw Error(fault);
}

// `stream`'s checks, its slots allocated and reset on first use. The caller holds `mutex`.
StreamChecks& with_slots(int device, void* handle, const char* op) {
  StreamChecks& s = checks_by_stream()[{device, handle}];
  if (s.slots == nullptr) {
    PIPIT_CUDA_CHECK(op, cudaMalloc(&s.slots, kSlots * sizeof(Slot)));
    PIPIT_CUDA_CHECK(op, reset(s.slots, kSlots, static_cast<cudaStream_t>(handle)));
  }
  return s;
}

}  // namespace

void check_indices(const IndexCheck& what, const Tensor& indices, std::optional<int64_t> ignore) {
  PIPIT_CHECK(indices.dtype() == DType::i64 && indices.is_contiguous(), what.op,
              ": indices must be contiguous I64, got ", indices.dtype());
  const int64_t n = indices.numel();
  if (n == 0) return;
  const int device = current_device();
  void* handle = current_stream_handle(device);
  const auto stream = static_cast<cudaStream_t>(handle);
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    full = checks_by_stream()[{device, handle}].queued.size() == kSlots;
  }
  if (full) {
    PIPIT_CUDA_CHECK(what.op, cudaStreamSynchronize(stream));
    raise_for(device, handle);
  }
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    StreamChecks& s = with_slots(device, handle, what.op);
    slot = s.slots + s.queued.size();
    s.queued.push_back(what);
  }
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 1024);
  find_bad_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      indices.data<int64_t>(), n, what.limit, ignore.has_value(), ignore.value_or(0), slot);
  PIPIT_CUDA_CHECK_LAUNCH(what.op);
  record_value_kernel<<<1, 1, 0, stream>>>(indices.data<int64_t>(), slot);
  PIPIT_CUDA_CHECK_LAUNCH(what.op);
}

void raise_index_faults(void* stream) {
  raise_for(current_device(), stream);
}

void raise_device_index_faults() {
  const int device = current_device();
  std::vector<void*> streams;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [key, s] : checks_by_stream()) {
      if (key.first == device && !s.queued.empty()) streams.push_back(key.second);
    }
  }
  for (void* stream : streams) raise_for(device, stream);
}

void prepare_index_checks(void* stream) {
  std::lock_guard<std::mutex> lock(mutex);
  with_slots(current_device(), stream, "cuda graph");
}

std::vector<IndexCheck> captured_index_checks(void* stream) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = checks_by_stream().find({current_device(), stream});
  return it == checks_by_stream().end() ? std::vector<IndexCheck>{} : it->second.queued;
}

void requeue_index_checks(void* stream, const std::vector<IndexCheck>& checks) {
  std::lock_guard<std::mutex> lock(mutex);
  // Still queued: the replay's results join the last one's in the same slots (atomicMin keeps
  // the first bad position), read back together.
  StreamChecks& s = checks_by_stream()[{current_device(), stream}];
  if (s.queued.empty()) s.queued = checks;
}

void forget_index_checks(int device, void* stream) noexcept {
  try {
    // Nothing reads this stream back any more, and a destructor cannot throw: the last
    // checks' failure is reported here rather than lost.
    const std::string fault = read_back(device, stream);
    if (!fault.empty()) {
      std::fprintf(stderr, "pipit: %s (found as its stream was destroyed)\n", fault.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipit: reading back index checks: %s\n", e.what());
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = checks_by_stream().find({device, stream});
  if (it == checks_by_stream().end()) return;
  cudaFree(it->second.slots);
  cudaGetLastError();
  checks_by_stream().erase(it);
}

}  // namespace pipit::cuda
