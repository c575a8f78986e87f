#include "pipeline/remote/distributed_pipeline.h"

#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/remote/stage_package.h"

#include <random>

namespace pipit {
namespace {

std::string new_session_name() {
  std::random_device device;
  return std::to_string(device()) + "-" + std::to_string(device());
}

}  // namespace

DistributedPipeline::DistributedPipeline(const Sequential& model, PipelineConfig config,
                                         std::vector<std::string> workers, TcpOptions tcp,
                                         const StateDict& optimizer_state)
    : workers_(std::move(workers)) {
  validate(config);
  const int endpoints = config.stages * config.replicas;
  PIPIT_CHECK(static_cast<int>(workers_.size()) == endpoints,
              "DistributedPipeline: ", config.stages, " stages x ", config.replicas,
              " replicas need ", endpoints,
              " workers (replica k's stage s is the (k * stages + s)-th), got ", workers_.size());
  const std::vector<LayerRange> ranges = partition_model(model, config);
  nlohmann::json peers = nlohmann::json::object();
  for (size_t s = 0; s < workers_.size(); ++s) peers[std::to_string(s)] = workers_[s];

  // A fresh session name per run keeps stages of an older run from joining this one.
  if (tcp.session.empty()) tcp.session = new_session_name();
  comm_ = std::make_shared<TcpCommunicator>(kCoordinator, tcp);
  try {
    start_workers(model, config, ranges, peers, optimizer_state);
  } catch (...) {
    // Release every worker claimed so far, so it serves the next coordinator at once.
    for (int e = 0; e < endpoints; ++e) comm_->send(e, Message(MessageKind::Shutdown, 0));
    comm_->close();
    throw;
  }
  const bool rebalance = config.rebalance.enabled;
  coordinator_ = std::make_unique<Coordinator>(comm_, std::move(config), ranges);
  coordinator_->refuse_remaps(remap_refusal(model));
  if (rebalance) coordinator_->enable_rebalancing(layer_kinds(model));
}

void DistributedPipeline::start_workers(const Sequential& model, const PipelineConfig& config,
                                        const std::vector<LayerRange>& ranges,
                                        const nlohmann::json& peers,
                                        const StateDict& optimizer_state) {
  const int endpoints = static_cast<int>(workers_.size());
  for (int e = 0; e < endpoints; ++e) {
    auto [host, port] = parse_endpoint(workers_[static_cast<size_t>(e)]);
    comm_->connect(e, host, port);
  }
  for (int e = 0; e < endpoints; ++e) {
    StagePackage package = make_stage_package(model, ranges, config, e % config.stages,
                                              optimizer_state, e / config.stages);
    package.peers = peers;
    comm_->send(e, stage_package_message(package));
  }
  std::vector<bool> ready(workers_.size(), false);
  for (int n = 0; n < endpoints;) {
    std::optional<Message> message = comm_->try_receive(config.timeout);
    if (!message) {
      std::string missing;
      for (size_t s = 0; s < ready.size(); ++s) {
        if (!ready[s]) missing += (missing.empty() ? "" : ", ") + workers_[s];
      }
      throw Error("DistributedPipeline: no READY within " + std::to_string(config.timeout.count()) +
                  " ms from " + missing);
    }
    const int from = message->from;
    if (from < 0 || from >= endpoints) continue;
    const std::string where = workers_[static_cast<size_t>(from)];
    if (message->kind == MessageKind::StageError || message->kind == MessageKind::PeerLost) {
      const std::string why = message->kind == MessageKind::StageError
                                  ? read_stage_error(*message).message
                                  : "connection lost: " + read_peer_lost(*message).reason;
      throw Error("DistributedPipeline: stage " + std::to_string(from) + " (" + where +
                  ") failed to start: " + why);
    }
    if (message->kind == MessageKind::Ready && !ready[static_cast<size_t>(from)]) {
      ready[static_cast<size_t>(from)] = true;
      ++n;
    }
  }
  for (int e = 0; e < endpoints; ++e) comm_->send(e, Message(MessageKind::Start, 0));
}

DistributedPipeline::~DistributedPipeline() {
  coordinator_->shutdown();
  comm_->close();
}

}  // namespace pipit
