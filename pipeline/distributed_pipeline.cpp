#include "pipeline/distributed_pipeline.h"

#include "pipeline/pipeline.h"
#include "pipeline/stage_package.h"

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
  PIPIT_CHECK(static_cast<int>(workers_.size()) == config.stages,
              "DistributedPipeline: ", config.stages, " stages need as many workers, got ",
              workers_.size());
  const std::vector<LayerRange> ranges = partition_model(model, config);
  nlohmann::json peers = nlohmann::json::object();
  for (size_t s = 0; s < workers_.size(); ++s) peers[std::to_string(s)] = workers_[s];

  // A fresh session name per run keeps stages of an older run from joining this one.
  if (tcp.session.empty()) tcp.session = new_session_name();
  comm_ = std::make_shared<TcpCommunicator>(kCoordinator, tcp);
  for (int s = 0; s < config.stages; ++s) {
    auto [host, port] = parse_endpoint(workers_[static_cast<size_t>(s)]);
    comm_->connect(s, host, port);
  }
  for (int s = 0; s < config.stages; ++s) {
    StagePackage package = make_stage_package(model, ranges, config, s, optimizer_state);
    package.peers = peers;
    comm_->send(s, stage_package_message(package));
  }
  std::vector<bool> ready(workers_.size(), false);
  for (int n = 0; n < config.stages;) {
    std::optional<Message> message = comm_->try_receive(config.timeout);
    if (!message) {
      std::string missing;
      for (size_t s = 0; s < ready.size(); ++s) {
        if (!ready[s]) missing += (missing.empty() ? "" : ", ") + workers_[s];
      }
      comm_->close();
      throw Error("DistributedPipeline: no READY within " + std::to_string(config.timeout.count()) +
                  " ms from " + missing);
    }
    if (message->kind == MessageKind::StageError || message->kind == MessageKind::PeerLost) {
      const auto from = static_cast<size_t>(message->from);
      const std::string where = from < workers_.size() ? workers_[from] : "?";
      const std::string why =
          message->kind == MessageKind::StageError
              ? message->meta.value("message", std::string("error"))
              : "connection lost: " + message->meta.value("reason", std::string("?"));
      for (int s = 0; s < config.stages; ++s) comm_->send(s, Message(MessageKind::Shutdown, 0));
      comm_->close();
      throw Error("DistributedPipeline: stage " + std::to_string(message->from) + " (" + where +
                  ") failed to start: " + why);
    }
    if (message->kind == MessageKind::Ready && !ready[static_cast<size_t>(message->from)]) {
      ready[static_cast<size_t>(message->from)] = true;
      ++n;
    }
  }
  for (int s = 0; s < config.stages; ++s) comm_->send(s, Message(MessageKind::Start, 0));
  coordinator_ = std::make_unique<Coordinator>(comm_, std::move(config));
}

DistributedPipeline::~DistributedPipeline() {
  coordinator_->shutdown();
  comm_->close();
}

}  // namespace pipit
