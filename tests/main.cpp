// Catch2's main, plus extra roles:
//   pipit_tests --worker FLAGS
// is a worker with pipit-worker's flags (support/worker_process.h), so the distributed tests start
// real worker processes from this same executable in every build configuration (sanitizers
// included);
//   pipit_tests --chaos-role worker|trainer FLAGS
// are the chaos test's worker and trainer (tools/chaos/roles.h);
//   pipit_tests --ps-role server|worker ...
// are the parameter-server tests' processes (tests/ps_task.h);
//   pipit_tests --mpi-role exchange
// is the MPI test's program, under mpirun (tests/mpi_roles.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "mpi_roles.h"
#include "ps_task.h"
#include "support/worker_process.h"
#include "tools/chaos/roles.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--chaos-role") == 0) {
    return pipit::chaos::role_main(argc, argv);
  }
#ifdef PIPIT_WITH_MPI
  if (argc >= 2 && std::strcmp(argv[1], "--mpi-role") == 0) {
    return pipit::testing::mpi_role_main(argc, argv);
  }
#endif
  if (argc >= 2 && std::strcmp(argv[1], "--ps-role") == 0) {
    return pipit::testing::ps_role_main(argc, argv);
  }
  // Stage packages of tests/rebalance_pipeline_test.cpp hold SleepLayers, which this role knows.
  if (pipit::support::worker_role_requested(argc, argv)) {
    return pipit::support::worker_role_main(argc, argv);
  }
  return Catch::Session().run(argc, argv);
}
