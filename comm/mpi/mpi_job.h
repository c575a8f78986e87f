#pragma once

namespace pipit {

// This process's place in the MPI job (initialising MPI if needed): call it before any
// MpiTransport starts, e.g. to size a pipeline by the job or share out a node's cores.
struct MpiJob {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this node
};
MpiJob mpi_job();

}  // namespace pipit
