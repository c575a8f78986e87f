#pragma once
// The host: the runtime behind tools/pipit-worker, a bare process that takes whatever role a
// coordinator ships it. It listens, waits for a coordinator, builds its Stage from the stage
// package the coordinator sends (or runs another kind of package, a parameter-server role),
// connects to its neighbouring stages, replies READY and serves steps until SHUTDOWN or until
// the coordinator goes away; then it waits for the next coordinator. A bad package is answered
// with a RoleError, not a crash; a coordinator that vanishes, shuts the run down or sends no
// package in time releases the host. Listening beyond loopback without a token is logged as a
// warning. ("Worker" in pipit's code is a parameter server's data-parallel worker, ps/worker.h.)
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "comm/tcp_communicator.h"

namespace pipit {

struct HostOptions {
  std::string listen = "127.0.0.1:7001";
  TcpOptions tcp;
  int runs = -1;          // serve this many coordinator runs, then return (-1: forever)
  std::string port_file;  // when set, the bound port is written there (for --listen host:0)
  // A coordinator that claims this worker and sends no stage package within this long loses
  // it: the worker goes back to waiting.
  std::chrono::milliseconds package_timeout{30000};
  // > 1: this worker's stage runs every layer this many times slower (StageSpec::slowdown).
  double slowdown = 1.0;
  // CPU threads per kernel; 0: the cores shared out over the run's stages on this host (the
  // stage package lists every stage's address), so workers that share a machine do not
  // spin against each other.
  int threads = 0;
  // Serves packages of other kinds than StagePackage, by kind (pipit-worker installs the
  // parameter-server roles for PsKind::Package, ps/role.h): called with the run's
  // communicator, claimed by the coordinator, and the package; returns when the role is done.
  // What it throws is logged and sent to the coordinator as a RoleError.
  using PackageServer =
      std::function<void(const std::shared_ptr<TcpCommunicator>&, const Message&)>;
  std::map<MessageKind, PackageServer> other_packages;
};

void run_host(const HostOptions& options);

}  // namespace pipit
