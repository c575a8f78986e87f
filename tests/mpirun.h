#pragma once
// Running this test executable under mpirun in one of its MPI roles (tests/mpi_roles.h), and
// whether mpirun can start processes here at all.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

namespace pipit::testing {

struct Run {
  int status = 0;
  std::string output;
};

inline Run run_command(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  Run run;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe)) run.output += buffer;
  run.status = pclose(pipe);
  return run;
}

// mpirun of this executable in an MPI role. Root in CI containers, and more ranks than cores
// here: Open MPI needs both allowed. No leak report for MPI's own allocations in sanitizer
// builds. `launch_flags`: more of mpirun's own (hosts, launch agent, interfaces). Killed, with
// status 124, after `seconds`.
inline Run mpirun(int ranks, const std::string& role, const std::string& launch_flags = "",
                  int seconds = 300) {
  return run_command(
      "timeout " + std::to_string(seconds) + " mpirun --allow-run-as-root --oversubscribe -np " +
      std::to_string(ranks) + " " + launch_flags + " -x ASAN_OPTIONS=detect_leaks=0 " +
      std::filesystem::read_symlink("/proc/self/exe").string() + " --mpi-role " + role + " 2>&1");
}

// Whether mpirun can start processes here at all; if not, the tests skip and say why.
inline bool mpirun_works() {
  static const Run probe =
      run_command("timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 true 2>&1");
  if (probe.status != 0) {
    WARN("skipped: mpirun cannot start processes on this machine:\n" << probe.output);
  }
  return probe.status == 0;
}

// Whether this build has MPI and mpirun can start processes here; if not, the test skips and
// says why.
inline bool mpi_ready() {
#ifndef PIPIT_WITH_MPI
  WARN("skipped: pipit was built without MPI (PIPIT_MPI=OFF, or no MPI found)");
  return false;
#else
  return mpirun_works();
#endif
}

// srun of this executable in an MPI role, through PMIx (what Slurm and Debian's Open MPI
// share; its PMI2 does not reach Open MPI), as many ranks as asked whatever the cores.
inline Run srun(int ranks, const std::string& role, int seconds = 300) {
  return run_command("timeout " + std::to_string(seconds) + " srun --mpi=pmix --overcommit -n " +
                     std::to_string(ranks) + " --export=ALL,ASAN_OPTIONS=detect_leaks=0 " +
                     std::filesystem::read_symlink("/proc/self/exe").string() + " --mpi-role " +
                     role + " 2>&1");
}

// Whether a Slurm answers here (tools/slurm_local.sh starts one); if not, the test skips and
// says why.
inline bool slurm_ready() {
  static const Run probe = run_command("timeout 10 sinfo -h -o %T 2>&1");
  const bool up = probe.status == 0 && (probe.output.find("idle") != std::string::npos ||
                                        probe.output.find("mixed") != std::string::npos);
  if (!up) {
    WARN("skipped: no Slurm answers here (tools/slurm_local.sh start makes one): " << probe.output);
  }
  return up;
}

}  // namespace pipit::testing
