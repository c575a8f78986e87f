#include "comm/mpi/mpi_job.h"

#include <mpi.h>

#include <cstdlib>

#include "comm/mpi/mpi_frames.h"

namespace pipit {

namespace {

void initialize() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) return;
#ifdef OPEN_MPI
  // Open MPI yields the core inside a call that finds nothing to do once mpirun oversubscribes
  // the node. Every call pipit makes after start-up returns at once, under the transport's lock,
  // and pipit sleeps by itself when idle: with those yields, a thread that had let others run
  // still held the lock, and every thread that needed MPI waited out their time slices (4
  // ranks on 2 cores: a rank's lock held that way for a fifth of the time).
  setenv("OMPI_MCA_mpi_yield_when_idle", "0", 1);
#endif
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  PIPIT_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI: this MPI library gives thread level ",
              provided, ", pipit's progress thread needs MPI_THREAD_SERIALIZED");
}

}  // namespace

MpiJob mpi_job() {
  initialize();
  MpiJob job;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &job.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &job.world_size), "MPI_Comm_size");
  MPI_Comm node;
  check_mpi(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, job.rank, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node, &job.local_rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(node, &job.local_size), "MPI_Comm_size");
  MPI_Comm_free(&node);
  return job;
}

}  // namespace pipit
