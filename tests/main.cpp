// Catch2's main, plus one extra role: `pipit_tests --worker LISTEN PORT_FILE [TOKEN]` runs a
// pipeline worker, so the distributed tests start real worker processes from this same
// executable in every build configuration (sanitizers included).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstring>

#include "pipeline/worker.h"
#include "tensor/parallel.h"

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "--worker") == 0) {
    pipit::WorkerOptions options;
    options.listen = argv[2];
    options.port_file = argv[3];
    if (argc >= 5) options.tcp.token = argv[4];
    options.tcp.peer_timeout = std::chrono::milliseconds(3000);
    // Several workers share the machine's cores; one thread each keeps them from spinning
    // against each other.
    pipit::set_num_threads(1);
    pipit::run_worker(options);
    return 0;
  }
  return Catch::Session().run(argc, argv);
}
