#pragma once
// Index checks that do not wait for the device. Ops that take indices (embedding, the
// cross-entropy targets) queue a check on their stream instead of reading a result back: a
// step then has no host synchronisation in it. The first bad index, in the order checks were
// queued, is raised as an Error naming the op, the index and its position at the stream's
// next read-back (a copy to the host, Stream::synchronize, synchronize(device)), as PyTorch's
// device-side asserts surface at the next synchronisation. Kernels skip bad indices (no
// access out of bounds) until then.
#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace pipit::cuda {

// What a failure says: "<op>: <noun> <value> at <place> <i> is out of range for <limit> <unit>",
// e.g. "embedding: index 11 at position 0 is out of range for 11 rows". Strings are literals.
struct IndexCheck {
  const char* op;
  const char* noun;
  const char* place;
  int64_t limit;
  const char* unit;
};

// Queues the check that every element of `indices` (i64, contiguous, on the current device and
// stream) lies in [0, limit) or equals `ignore`.
void check_indices(const IndexCheck& what, const Tensor& indices,
                   std::optional<int64_t> ignore = std::nullopt);
// Raises the first failed check queued on `stream` (a cudaStream_t of the current device),
// and forgets every check queued there before; call after the host has waited for the stream.
void raise_index_faults(void* stream);
// The same for every stream of the current device, after the host waited for the device.
void raise_device_index_faults();

// For cuda::Graph, whose every replay repeats the checks its capture queued, into the same
// result slots (replays not read back in between report the first bad position of any, with
// the value that position holds in the latest). prepare_index_checks gives `stream` its slots
// before a capture (no allocation may be recorded into it); captured_index_checks returns what is
// queued there; and requeue_index_checks queues those again after a replay unless they still are.
void prepare_index_checks(void* stream);
std::vector<IndexCheck> captured_index_checks(void* stream);
void requeue_index_checks(void* stream, const std::vector<IndexCheck>& checks);
// Called as `stream` (of `device`) is destroyed, after it has finished: reads its checks back
// one last time, printing a failure to stderr (a destructor cannot throw), and frees its
// slots, so no read-back touches a dead stream.
void forget_index_checks(int device, void* stream) noexcept;

}  // namespace pipit::cuda
