#include "ps/role.h"

#include <algorithm>
#include <thread>

#include "comm/control.h"
#include "nn/registry.h"
#include "ps/messages.h"
#include "ps/package.h"
#include "ps/parameter_server.h"
#include "ps/run.h"
#include "ps/tcp.h"
#include "ps/worker.h"
#include "tensor/parallel.h"

namespace pipit {

namespace {

// The run's checkpoint options, as the package carries them.
PsRunOptions checkpoints_of(const PsPackage& package) {
  PsRunOptions options;
  options.checkpoint_dir = package.checkpoint_dir;
  options.checkpoint_every = package.checkpoint_every;
  options.resume = package.resume;
  return options;
}

// Says Ready (its step field the version it starts at), serves the shard, then sends the
// launcher its final state (its step field the version).
void serve_shard(const std::shared_ptr<TcpCommunicator>& comm, const PsPackage& package,
                 const std::function<void(const std::string&)>& log) {
  const PsConfig& config = package.config;
  comm->set_id(config.server_id(package.index));
  NamedParameters parameters;
  for (const auto& [name, value] : package.weights) {
    parameters.emplace_back(name, value.contiguous().clone().requires_grad_());
  }
  ParameterServer server(comm, std::move(parameters), config, package.index);
  server.log = [&log](const std::string& line) { log(line); };
  const PsRunOptions options = checkpoints_of(package);
  start_shard(server, options, package.model);
  log("[ps] shard " + std::to_string(package.index) + " of " + std::to_string(config.servers) +
      " ready (" + config.mode + ", " + std::to_string(config.workers) + " workers)");
  comm->send(kCoordinator, Message(MessageKind::Ready, server.stats().version));
  server.serve();
  end_shard(server, options, package.model);
  std::vector<Tensor> tensors;
  StateReply reply;
  for (auto& [name, value] : server.weights()) {
    reply.weights.push_back(name);
    tensors.push_back(value);
  }
  for (auto& [name, value] : server.optimizer_state()) {
    reply.optimizer.push_back(name);
    tensors.push_back(value);
  }
  comm->send(kCoordinator, to_message(reply, server.stats().version, std::move(tensors)));
}

}  // namespace

void serve_ps_package(const std::shared_ptr<TcpCommunicator>& comm, const Message& message,
                      const std::function<void(const std::string&)>& log, int threads) {
  const PsPackage package = read_ps_package(message);
  const PsConfig& config = package.config;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  set_num_threads(threads > 0 ? threads : std::max(1, cores / package.sharing));
  if (package.role == "shard") return serve_shard(comm, package, log);
  comm->set_id(config.worker_id(package.index));
  connect_to_ps_shards(*comm, config, package.index, package.shards);
  PsWorker worker(comm, build_module(package.model), config, package.index, package.slowdown);
  log("[ps] worker " + std::to_string(package.index) + " of " + std::to_string(config.workers) +
      " ready");
  comm->send(kCoordinator, Message(MessageKind::Ready, 0));
  run_ps_worker(
      worker, config, package.steps, package.resume,
      [&](int64_t step) { return ps_batch(package, step); }, nullptr);
  comm->send(kCoordinator, Message(PsKind::Leave, 0));
}

}  // namespace pipit
