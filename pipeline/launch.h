#pragma once
// Launch: where a pipeline's stages run, the one argument by which a training program chooses
// its transport (pipeline/pipeline.h):
//   Launch::threads()                  every stage on a thread of this process;
//   Launch::workers({"host:port", ...}, tcp)
//                                      stage s of replica k on worker k * p + s, bare
//                                      processes (tools/pipit-worker) reached over TCP;
//   Launch::mpi(options)               one stage per rank of an MPI job (mpirun, srun), every
//                                      rank running the same program.
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/tcp_communicator.h"

namespace pipit {

struct Launch {
  enum class Kind { threads, workers, mpi };
  Kind kind = Kind::threads;
  std::vector<std::string> addresses;  // workers: endpoint e's "host:port"
  TcpOptions tcp_options;              // workers
  MpiOptions mpi_options;              // mpi

  static Launch threads() { return {}; }
  static Launch workers(std::vector<std::string> addresses, TcpOptions tcp = {}) {
    Launch launch;
    launch.kind = Kind::workers;
    launch.addresses = std::move(addresses);
    launch.tcp_options = std::move(tcp);
    return launch;
  }
  static Launch mpi(MpiOptions options = {}) {
    Launch launch;
    launch.kind = Kind::mpi;
    launch.mpi_options = std::move(options);
    return launch;
  }
};

}  // namespace pipit
