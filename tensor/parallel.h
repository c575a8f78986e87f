#pragma once
#include <cstdint>

namespace pipit {

// Threads used by CPU kernels: OpenMP loops, GEMM tiles included (OpenBLAS itself runs
// single-threaded, so the two never compete for cores). Defaults to the machine's cores.
void set_num_threads(int threads);
int get_num_threads();

// Loops with fewer elements than this run on the calling thread: below it, waking a thread
// team costs more than it saves.
constexpr int64_t kParallelGrain = 32768;

}  // namespace pipit
