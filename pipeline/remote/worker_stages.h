#pragma once
// WorkerStages: a pipeline's stages in worker processes (tools/pipit-worker) over TCP
// (Launch::workers). Starting, it handshakes with every worker, ships each its stage package
// (config slice, weights, optimizer config and state, its neighbours' addresses), waits until
// every stage is READY, then sends START. Stages exchange activations and gradients with
// their neighbours directly. A start that fails releases every worker it had claimed, so each
// serves the next coordinator at once.
#include <memory>
#include <string>
#include <vector>

#include "comm/tcp_communicator.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/stage_host.h"

namespace pipit {

class WorkerStages final : public StageHost {
 public:
  // workers[e] ("host:port") runs endpoint e: stage e % p of replica e / p.
  WorkerStages(const Sequential& model, const PipelineConfig& config,
               const std::vector<LayerRange>& ranges, std::vector<std::string> workers,
               TcpOptions tcp, const StateDict& optimizer_state);

  std::shared_ptr<Communicator> coordinator_endpoint() override { return comm_; }
  void stop() override { comm_->close(); }

 private:
  void start(const Sequential& model, const PipelineConfig& config,
             const std::vector<LayerRange>& ranges, const StateDict& optimizer_state);
  void await_ready(std::chrono::milliseconds timeout);

  std::vector<std::string> workers_;
  std::shared_ptr<TcpCommunicator> comm_;
};

}  // namespace pipit
