// The MPI transport (comm/mpi/), through mpirun: tests/mpi_roles.h is the program.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

TEST_CASE("MPI: tensors between ranks and endpoints sharing a rank, from several threads",
          "[mpi]") {
#ifndef PIPIT_WITH_MPI
  WARN("skipped: pipit was built without MPI (PIPIT_MPI=OFF, or no MPI found)");
#else
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  // Root in CI containers, and more ranks than cores here: Open MPI needs both allowed. No
  // leak report for MPI's own allocations in sanitizer builds.
  const std::string command =
      "mpirun --allow-run-as-root --oversubscribe -np 3 -x "
      "ASAN_OPTIONS=detect_leaks=0 " +
      self + " --mpi-role exchange 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::string output;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  INFO(output);
  CHECK(status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(output.find("rank " + std::to_string(rank) + " ok") != std::string::npos);
  }
#endif
}
