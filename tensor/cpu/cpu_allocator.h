#pragma once
// CPU memory for tensors: 64-byte aligned blocks. Blocks of 64 KiB and more are kept in
// size-class free lists when released and handed out again, because mapping fresh pages for
// every large activation costs more in page faults than the kernels spend computing.
#include <cstddef>
#include <memory>

#include "tensor/storage.h"

namespace pipit {

struct MemoryStats {
  size_t allocated = 0;       // bytes held by live tensors
  size_t peak_allocated = 0;  // the most `allocated` has been since the last reset
  size_t reserved = 0;        // bytes cached for reuse
};

std::shared_ptr<Storage> cpu_allocate(size_t nbytes);
MemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();
// Returns every cached block to the system.
void cpu_empty_cache();

}  // namespace pipit
