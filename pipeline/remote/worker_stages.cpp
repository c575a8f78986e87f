#include "pipeline/remote/worker_stages.h"

#include <random>

#include "pipeline/protocol/messages.h"
#include "pipeline/remote/stage_package.h"

namespace pipit {
namespace {

std::string new_session_name() {
  std::random_device device;
  return std::to_string(device()) + "-" + std::to_string(device());
}

}  // namespace

WorkerStages::WorkerStages(const Sequential& model, const PipelineConfig& config,
                           const std::vector<LayerRange>& ranges, std::vector<std::string> workers,
                           TcpOptions tcp, const StateDict& optimizer_state)
    : workers_(std::move(workers)) {
  const int endpoints = config.stages * config.replicas;
  PIPIT_CHECK(static_cast<int>(workers_.size()) == endpoints, "Pipeline: ", config.stages,
              " stages x ", config.replicas, " replicas need ", endpoints,
              " workers (replica k's stage s is the (k * stages + s)-th), got ", workers_.size());
  // A fresh session name per run keeps stages of an older run from joining this one.
  if (tcp.session.empty()) tcp.session = new_session_name();
  comm_ = std::make_shared<TcpCommunicator>(kCoordinator, tcp);
  try {
    start(model, config, ranges, optimizer_state);
  } catch (...) {
    // Release every worker claimed so far, so it serves the next coordinator at once.
    for (int e = 0; e < endpoints; ++e) comm_->send(e, Message(MessageKind::Shutdown, 0));
    comm_->close();
    throw;
  }
}

void WorkerStages::start(const Sequential& model, const PipelineConfig& config,
                         const std::vector<LayerRange>& ranges, const StateDict& optimizer_state) {
  const int endpoints = static_cast<int>(workers_.size());
  nlohmann::json peers = nlohmann::json::object();
  for (int e = 0; e < endpoints; ++e) {
    peers[std::to_string(e)] = workers_[static_cast<size_t>(e)];
    auto [host, port] = parse_endpoint(workers_[static_cast<size_t>(e)]);
    comm_->connect(e, host, port);
  }
  for (int e = 0; e < endpoints; ++e) {
    StagePackage package = make_stage_package(model, ranges, config, e % config.stages,
                                              optimizer_state, e / config.stages);
    package.peers = peers;
    comm_->send(e, stage_package_message(package));
  }
  await_ready(config.timeout);
  for (int e = 0; e < endpoints; ++e) comm_->send(e, Message(MessageKind::Start, 0));
}

void WorkerStages::await_ready(std::chrono::milliseconds timeout) {
  const int endpoints = static_cast<int>(workers_.size());
  std::vector<bool> ready(workers_.size(), false);
  for (int n = 0; n < endpoints;) {
    std::optional<Message> message = comm_->try_receive(timeout);
    if (!message) {
      std::string missing;
      for (size_t s = 0; s < ready.size(); ++s) {
        if (!ready[s]) missing += (missing.empty() ? "" : ", ") + workers_[s];
      }
      throw Error("Pipeline: no READY within " + std::to_string(timeout.count()) + " ms from " +
                  missing);
    }
    const int from = message->from;
    if (from < 0 || from >= endpoints) continue;
    const std::string where = workers_[static_cast<size_t>(from)];
    if (message->kind == MessageKind::RoleError || message->kind == MessageKind::PeerLost) {
      const std::string why = message->kind == MessageKind::RoleError
                                  ? read_role_error(*message).message
                                  : "connection lost: " + read_peer_lost(*message).reason;
      throw Error("Pipeline: stage " + std::to_string(from) + " (" + where +
                  ") failed to start: " + why);
    }
    if (message->kind == MessageKind::Ready && !ready[static_cast<size_t>(from)]) {
      ready[static_cast<size_t>(from)] = true;
      ++n;
    }
  }
}

}  // namespace pipit
