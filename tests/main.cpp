// Catch2's main, plus extra roles:
//   pipit_tests --worker LISTEN PORT_FILE [--token=T] [--package-timeout-ms=N] [--slowdown=F]
// runs a pipeline worker, so the distributed tests start real worker processes from this
// same executable in every build configuration (sanitizers included);
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
#include "pipeline/remote/worker.h"
#include "ps/messages.h"
#include "ps/role.h"
#include "ps_task.h"
#include "support/sleep_layer.h"
#include "tensor/parallel.h"
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
  if (argc >= 4 && std::strcmp(argv[1], "--worker") == 0) {
    pipit::WorkerOptions options;
    options.listen = argv[2];
    options.port_file = argv[3];
    for (int i = 4; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg.rfind("--token=", 0) == 0) options.tcp.token = arg.substr(8);
      if (arg.rfind("--package-timeout-ms=", 0) == 0) {
        options.package_timeout = std::chrono::milliseconds(std::stoll(arg.substr(21)));
      }
      if (arg.rfind("--slowdown=", 0) == 0) options.slowdown = std::stod(arg.substr(11));
    }
    options.tcp.peer_timeout = std::chrono::milliseconds(3000);
    // Several workers share the machine's cores; one thread each keeps them from spinning
    // against each other.
    options.threads = 1;
    pipit::set_num_threads(1);
    // Stage packages of tests/rebalance_pipeline_test.cpp hold these.
    pipit::bench::register_sleep_layer();
    options.other_packages[pipit::PsKind::Package] =
        [](const std::shared_ptr<pipit::TcpCommunicator>& comm, const pipit::Message& package) {
          pipit::serve_ps_package(
              comm, package,
              [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }, 1);
        };
    pipit::run_worker(options);
    return 0;
  }
  return Catch::Session().run(argc, argv);
}
