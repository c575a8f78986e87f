#pragma once
// ThreadStages: a pipeline's stages on threads of this process (Launch::threads), talking
// through a LocalCommunicator. The stages share the model's parameters, so after training the
// model itself holds the trained weights, also after a remap moved layers between stages.
// With replicas, replicas 1..r-1 train copies of the model, which stay equal to it bit for
// bit.
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "comm/local_communicator.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/stage_host.h"

namespace pipit {

class ThreadStages final : public StageHost {
 public:
  ThreadStages(std::shared_ptr<Sequential> model, const PipelineConfig& config,
               const std::vector<LayerRange>& ranges, const StateDict& optimizer_state);

  std::shared_ptr<Communicator> coordinator_endpoint() override;
  void coordinate(Coordinator& coordinator) override;
  std::vector<Stage*> stages() override;
  // Waits up to `timeout` for each stage's thread; one still busy is left running (a stage
  // stuck inside a layer cannot be interrupted) rather than hang the caller.
  void stop() override;

 private:
  // Puts the stages' modules into model_ (a remap rebuilt the layers it moved).
  void adopt_stage_modules();

  std::shared_ptr<Sequential> model_;
  std::chrono::milliseconds timeout_;
  std::vector<std::shared_ptr<Sequential>> replica_models_;  // replicas 1..r-1
  std::shared_ptr<LocalHub> hub_;
  std::vector<std::shared_ptr<Stage>> stages_;
  std::vector<std::thread> threads_;
  std::vector<std::future<void>> stopped_;
};

}  // namespace pipit
