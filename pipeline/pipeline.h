#pragma once
// Pipeline: a Sequential model cut into stages that train concurrently in this process, one
// thread per stage, talking through a LocalCommunicator. The stages share the model's
// parameters, so after training the model itself holds the trained weights. With
// config.replicas = r > 1 the replicas 1..r-1 train copies of the model (copy_model), which
// stay equal to it bit for bit.
//
//   auto model = gpt(config);
//   Pipeline pipeline(model, {.stages = 4, .microbatches = 8, .schedule = "1f1b"});
//   for (...) double loss = pipeline.train_step(tokens, targets);
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "comm/local_communicator.h"
#include "nn/sequential.h"
#include "pipeline/coordinator.h"
#include "pipeline/partition.h"
#include "pipeline/stage.h"

namespace pipit {

// The chunk layer ranges `config.partition` gives for `model`.
std::vector<LayerRange> partition_model(const Sequential& model, const PipelineConfig& config);
// Each layer's config as text: layers of the same kind cost the same on the same stage
// (what automatic rebalancing assumes).
std::vector<std::string> layer_kinds(const Sequential& model);
// The spec of stage `stage` of replica `replica`: its chunks as slices of `model`, the
// schedule and optimizer.
StageSpec make_stage_spec(const Sequential& model, const std::vector<LayerRange>& ranges,
                          const PipelineConfig& config, int stage,
                          const StateDict& optimizer_state = {}, int replica = 0);
// A model of the same config and weights, sharing no tensor with `model` (a replica's).
std::shared_ptr<Sequential> copy_model(const Sequential& model);

class Pipeline {
 public:
  // `optimizer_state` (a checkpoint's, or empty) restores every stage's optimizer.
  Pipeline(std::shared_ptr<Sequential> model, PipelineConfig config,
           const StateDict& optimizer_state = {});
  // Stops the stage threads; one still busy after config.timeout is detached, not waited on.
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  double train_step(const Tensor& input, const Tensor& target) {
    return coordinator_->train_step(input, target);
  }
  Tensor forward(const Tensor& input) { return coordinator_->forward(input); }

  // Moves layers between stages, between steps (Coordinator::remap): chunk c holds ranges[c]
  // afterwards. After every remap, this one or an automatic one, the model's layers are the
  // modules the stages now train.
  void remap(const std::vector<LayerRange>& ranges) { coordinator_->remap(ranges); }
  // Moves `count` layers from global chunk `from` to its neighbour `to` (with v = 1 chunks
  // are stages): e.g. move_layers(1, 0, 3) hands stage 1's first 3 layers to stage 0.
  void move_layers(int from, int to, int64_t count) {
    remap(pipit::move_layers(chunk_ranges(), from, to, count));
  }

  Coordinator& coordinator() { return *coordinator_; }
  // By endpoint: stage s of replica k is k * p + s.
  Stage& stage(int index) { return *stages_.at(static_cast<size_t>(index)); }
  const std::vector<LayerRange>& chunk_ranges() const { return coordinator_->chunk_ranges(); }

 private:
  // Puts the stages' modules into model_ (a remap rebuilt the layers it moved).
  void adopt_stage_modules();

  std::shared_ptr<Sequential> model_;
  std::vector<std::shared_ptr<Sequential>> replica_models_;  // replicas 1..r-1
  std::shared_ptr<LocalHub> hub_;
  std::vector<std::shared_ptr<Stage>> stages_;
  std::vector<std::thread> threads_;
  std::vector<std::future<void>> stopped_;
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace pipit
