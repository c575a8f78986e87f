// pipit-worker: serves pipeline stages to coordinators over TCP, one run after another, and
// parameter-server shard and worker roles to launchers (ps/launch.h).
//   pipit-worker --listen 127.0.0.1:7001 [--token-file FILE]
#include <cstdio>

#include "pipeline/remote/worker.h"
#include "ps/messages.h"
#include "ps/role.h"
#include "support/flags.h"
#include "support/tcp_flags.h"
#include "tensor/parallel.h"

int main(int argc, char** argv) {
  samples::Flags flags("pipit-worker",
                       "Serves one pipeline stage per run to a coordinator (train_gpt --workers).");
  flags.add("listen", "127.0.0.1:7001",
            "address to accept coordinators and stages on (port 0: any)");
  flags.add("port-file", "", "write the bound port to this file");
  flags.add("runs", "-1", "serve this many runs, then exit (-1: forever)");
  samples::add_tcp_flags(flags, samples::TcpSide::worker);
  flags.add("package-timeout-ms", "30000",
            "a coordinator that claims this worker must send its stage within this");
  flags.add("threads", "0",
            "CPU threads per kernel (0: the cores shared out over the run's stages on this host)");
  flags.add("slowdown", "1",
            "run every layer this many times slower, as a slower machine would (>= 1; for "
            "trying load rebalancing on one computer)");
  flags.parse(argc, argv);
  try {
    pipit::WorkerOptions options;
    options.listen = flags.str("listen");
    options.port_file = flags.str("port-file");
    options.runs = static_cast<int>(flags.integer("runs", -1));
    options.tcp = samples::tcp_options(flags, samples::TcpSide::worker);
    options.package_timeout = std::chrono::milliseconds(flags.integer("package-timeout-ms"));
    options.slowdown = flags.number("slowdown");
    options.threads = static_cast<int>(flags.integer("threads", 0));
    if (options.threads > 0) pipit::set_num_threads(options.threads);
    if (!(options.slowdown >= 1 && options.slowdown <= 1000)) {
      flags.fail("--slowdown must be in [1, 1000], got " + flags.str("slowdown"));
    }
    options.other_packages[pipit::PsKind::Package] =
        [log = options.tcp.log](const std::shared_ptr<pipit::TcpCommunicator>& comm,
                                const pipit::Message& package) {
          pipit::serve_ps_package(
              comm, package, log ? log : [](const std::string& line) {
                std::fprintf(stderr, "%s\n", line.c_str());
              });
        };
    pipit::run_worker(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipit-worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
