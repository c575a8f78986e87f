#pragma once
// One parameter-server training run, wherever its shards and workers run: a training program
// is the same for all three but for the PsLaunch it passes.
//   PsLaunch::threads()                every shard and worker a thread of this process;
//   PsLaunch::hosts({"host:port", ...}, tcp)
//                                      bare pipit-worker processes: the first config.servers
//                                      addresses serve the shards, the next config.workers
//                                      the workers;
//   PsLaunch::mpi(options)             ranks of an MPI job: every rank runs the same program
//                                      and calls train_ps (ps/mpi/mpi_ps.h).
// On hosts the launcher claims every host (a fresh session per run), sends each shard its
// parameters and each worker the model's config and its batches of every step, waits until
// every shard is Ready before starting the workers, and collects every shard's final weights,
// optimizer state and version. Any role's error, lost connection or silence beyond
// config.timeout ends the run with an Error naming the role and address, after telling the
// others to stop.
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/tcp_communicator.h"
#include "nn/module.h"
#include "ps/config.h"
#include "ps/run.h"

namespace pipit {

struct PsLaunch {
  enum class Kind { threads, hosts, mpi };
  Kind kind = Kind::threads;
  std::vector<std::string> addresses;  // hosts: role id's "host:port"
  TcpOptions tcp_options;              // hosts
  MpiOptions mpi_options;              // mpi

  static PsLaunch threads() { return {}; }
  static PsLaunch hosts(std::vector<std::string> addresses, TcpOptions tcp = {}) {
    PsLaunch launch;
    launch.kind = Kind::hosts;
    launch.addresses = std::move(addresses);
    launch.tcp_options = std::move(tcp);
    return launch;
  }
  static PsLaunch mpi(MpiOptions options = {}) {
    PsLaunch launch;
    launch.kind = Kind::mpi;
    launch.mpi_options = std::move(options);
    return launch;
  }
};

// Trains `model` (its config and weights are the replicas' start) with `config`'s shards and
// workers where `launch` says. Under MPI each rank's report holds its own part (mpi_ps.h).
PsRunReport train_ps(const Module& model, const PsConfig& config, const PsRunOptions& options,
                     PsLaunch launch = PsLaunch::threads());

}  // namespace pipit
