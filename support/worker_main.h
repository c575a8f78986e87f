#pragma once
// The one worker front-end. pipit-worker's main is worker_main; tests, benchmarks and the
// chaos tool make their own executables workers with it (`BINARY --worker FLAGS...`), so
// every worker process takes pipit-worker's flags. It serves pipeline stages to coordinators
// (train_gpt --workers), one run after another, and parameter-server roles to launchers
// (ps/launch.h).
#include <cstdio>
#include <string>

#include "pipeline/remote/host.h"
#include "ps/messages.h"
#include "ps/role.h"
#include "support/flags.h"
#include "support/run_flags.h"
#include "support/tcp_flags.h"
#include "tensor/parallel.h"

namespace pipit::support {

// argv[0] is skipped, as a program's own name; `program` names it in usage and errors.
inline int worker_main(int argc, char** argv, const std::string& program = "pipit-worker") {
  Flags flags(program,
              "Serves one pipeline stage per run to a coordinator (train_gpt --workers), or a "
              "parameter-server role to a launcher (train_ps --workers).");
  flags.add("listen", "127.0.0.1:7001",
            "address to accept coordinators and stages on (port 0: any)");
  flags.add("port-file", "", "write the bound port to this file");
  flags.add("runs", "-1", "serve this many runs, then exit (-1: forever)");
  add_tcp_flags(flags, TcpSide::worker);
  flags.add("package-timeout-ms", "30000",
            "a coordinator that claims this worker must send its stage within this");
  add_threads_flag(flags, "0", "the cores shared out over the run's stages on this host");
  flags.add("slowdown", "1",
            "run every layer this many times slower, as a slower machine would (>= 1; for "
            "trying load rebalancing on one computer)");
  flags.parse(argc, argv);
  try {
    pipit::HostOptions options;
    options.listen = flags.str("listen");
    options.port_file = flags.str("port-file");
    options.runs = static_cast<int>(flags.integer("runs", -1));
    options.tcp = tcp_options(flags, TcpSide::worker);
    options.package_timeout = std::chrono::milliseconds(flags.integer("package-timeout-ms"));
    options.slowdown = flags.number("slowdown");
    options.threads = static_cast<int>(flags.integer("threads", 0));
    if (options.threads > 0) pipit::set_num_threads(options.threads);
    if (!(options.slowdown >= 1 && options.slowdown <= 1000)) {
      flags.fail("--slowdown must be in [1, 1000], got " + flags.str("slowdown"));
    }
    const int threads = options.threads;
    options.other_packages[pipit::PsKind::Package] =
        [log = options.tcp.log, threads](const std::shared_ptr<pipit::TcpCommunicator>& comm,
                                         const pipit::Message& package) {
          pipit::serve_ps_package(
              comm, package,
              log ? log
                  : [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
              threads);
        };
    pipit::run_host(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace pipit::support
