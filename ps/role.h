#pragma once
// Serves the parameter-server role in a PsPackage (ps/package.h) on a worker process's
// communicator: the one a launcher claimed, listening on the worker's address. pipit-worker
// installs it as HostOptions::other_packages[PsKind::Package]. Tells the launcher (kCoordinator)
// Ready once the role is in place, and at the end: a shard, its final weights and optimizer state
// (a State message whose step is the shard's version); a worker, PsLeave. Errors propagate.
#include <functional>
#include <memory>
#include <string>

#include "comm/tcp_communicator.h"

namespace pipit {

// threads > 0: CPU threads per kernel; 0: the cores shared out over the run's roles on this
// host (the package says how many).
void serve_ps_package(const std::shared_ptr<TcpCommunicator>& comm, const Message& package,
                      const std::function<void(const std::string&)>& log, int threads = 0);

}  // namespace pipit
