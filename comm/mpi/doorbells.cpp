#include "comm/mpi/doorbells.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>

#include "comm/mpi/mpi_frames.h"

namespace pipit {

// A cache line each: a rank's sleeping thread and the ranks ringing it share only its own.
struct alignas(64) NodeDoorbells::Bell {
  std::atomic<uint32_t> rings{0};
  std::atomic<uint32_t> sleeping{0};
};

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Shared (not FUTEX_PRIVATE): the word lives in memory several processes map.
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

std::unique_ptr<NodeDoorbells> NodeDoorbells::open(int rank, int world_size, int ranks_here) {
  if (ranks_here != world_size) return nullptr;  // the same answer on every rank

  // Rank 0 names and makes the segment; the others open it; once all have, rank 0 unlinks
  // the name, so nothing outlives the job.
  const size_t bytes = sizeof(Bell) * static_cast<size_t>(world_size);
  char name[64] = {};
  int fd = -1;
  if (rank == 0) {
    std::snprintf(name, sizeof name, "/pipit-bells-%d-%08x", static_cast<int>(getpid()),
                  static_cast<unsigned>(std::random_device{}()));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      fd = -1;
    }
  }
  check_mpi(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (rank != 0) fd = shm_open(name, O_RDWR, 0600);
  void* memory = MAP_FAILED;
  if (fd >= 0) {
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  int mine = memory != MAP_FAILED ? 1 : 0, all = 0;
  check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  if (rank == 0) shm_unlink(name);
  if (!all) {
    if (memory != MAP_FAILED) munmap(memory, bytes);
    return nullptr;
  }
  // ftruncate zero-fills, which is every Bell's initial state.
  return std::unique_ptr<NodeDoorbells>(new NodeDoorbells(static_cast<Bell*>(memory), bytes, rank));
}

NodeDoorbells::~NodeDoorbells() {
  munmap(bells_, bytes_);
}

void NodeDoorbells::ring(int rank) {
  Bell& bell = bells_[rank];
  // seq_cst here and in wait(): either the sleeper sees this ring before it sleeps, or this
  // sees it sleeping and wakes it.
  bell.rings.fetch_add(1);
  if (bell.sleeping.load() != 0) futex(&bell.rings, FUTEX_WAKE, INT_MAX, nullptr);
}

uint32_t NodeDoorbells::seen() const {
  return bells_[rank_].rings.load();
}

bool NodeDoorbells::wait(uint32_t seen, std::chrono::microseconds timeout) {
  Bell& bell = bells_[rank_];
  bell.sleeping.store(1);
  if (bell.rings.load() == seen) {
    const long long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    const timespec relative{static_cast<time_t>(ns / 1000000000),
                            static_cast<long>(ns % 1000000000)};
    futex(&bell.rings, FUTEX_WAIT, seen, &relative);
  }
  bell.sleeping.store(0);
  return bell.rings.load() != seen;
}

}  // namespace pipit
