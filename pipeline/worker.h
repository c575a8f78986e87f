#pragma once
// The worker runtime behind tools/pipit-worker: it listens, waits for a coordinator, builds
// its Stage from the stage package the coordinator sends, connects to its neighbouring stages,
// replies READY and serves steps until SHUTDOWN or until the coordinator goes away; then it
// waits for the next coordinator. A bad package is answered with a StageError, not a crash.
#include <string>

#include "comm/tcp_communicator.h"

namespace pipit {

struct WorkerOptions {
  std::string listen = "127.0.0.1:7001";
  TcpOptions tcp;
  int runs = -1;          // serve this many coordinator runs, then return (-1: forever)
  std::string port_file;  // when set, the bound port is written there (for --listen host:0)
};

void run_worker(const WorkerOptions& options);

}  // namespace pipit
