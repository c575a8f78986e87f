#pragma once
// DistributedPipeline: the same Coordinator as Pipeline, driving stages in worker processes
// (tools/pipit-worker) over TCP. The constructor handshakes with every worker, ships each its
// stage package (config slice, weights, optimizer config and state, its neighbours'
// addresses), waits until every stage is READY, then sends START. Stages exchange
// activations and gradients with their neighbours directly. A constructor that fails
// releases every worker it had claimed.
#include <memory>
#include <string>
#include <vector>

#include "comm/tcp_communicator.h"
#include "nn/sequential.h"
#include "pipeline/coordinator.h"
#include "pipeline/partition.h"

namespace pipit {

class DistributedPipeline {
 public:
  // workers[s] ("host:port") runs stage s. `optimizer_state` (a checkpoint's, or empty)
  // restores each stage's optimizer.
  DistributedPipeline(const Sequential& model, PipelineConfig config,
                      std::vector<std::string> workers, TcpOptions tcp = {},
                      const StateDict& optimizer_state = {});
  ~DistributedPipeline();  // tells every worker to shut the run down
  DistributedPipeline(const DistributedPipeline&) = delete;
  DistributedPipeline& operator=(const DistributedPipeline&) = delete;

  double train_step(const Tensor& input, const Tensor& target) {
    return coordinator_->train_step(input, target);
  }
  Tensor forward(const Tensor& input) { return coordinator_->forward(input); }
  // As Pipeline's: layers travel from worker to worker over the stages' own connections.
  void remap(const std::vector<LayerRange>& ranges) { coordinator_->remap(ranges); }
  void move_layers(int from, int to, int64_t count) {
    remap(pipit::move_layers(chunk_ranges(), from, to, count));
  }
  const std::vector<LayerRange>& chunk_ranges() const { return coordinator_->chunk_ranges(); }
  Coordinator& coordinator() { return *coordinator_; }
  const std::vector<std::string>& workers() const { return workers_; }

 private:
  void start_workers(const Sequential& model, const PipelineConfig& config,
                     const std::vector<LayerRange>& ranges, const nlohmann::json& peers,
                     const StateDict& optimizer_state);

  std::vector<std::string> workers_;
  std::shared_ptr<TcpCommunicator> comm_;
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace pipit
