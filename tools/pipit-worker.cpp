// pipit-worker: serves pipeline stages to coordinators over TCP, one run after another, and
// parameter-server shard and worker roles to launchers (ps/launch.h).
//   pipit-worker --listen 127.0.0.1:7001 [--token-file FILE]
// Its flags and behaviour are support/worker_main.h's, which tests and benchmarks share.
#include "support/worker_main.h"

int main(int argc, char** argv) {
  return pipit::support::worker_main(argc, argv);
}
