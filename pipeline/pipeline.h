#pragma once
// Pipeline: a Sequential model cut into stages that train concurrently, driven by one
// Coordinator, wherever the stages run (pipeline/launch.h): on threads of this process, in
// worker processes over TCP, or on the ranks of an MPI job. A training program is the same
// for all three but for the Launch it passes:
//
//   auto model = gpt(config);
//   Pipeline pipeline(model, {.stages = 4, .microbatches = 8, .schedule = "1f1b"});
//   // or Pipeline pipeline(model, config, Launch::workers({"node1:7000", ...}, tcp));
//   // or Pipeline pipeline(model, config, Launch::mpi());  (every rank; see below)
//   if (!pipeline.is_coordinator()) return pipeline.serve(), 0;
//   for (...) double loss = pipeline.train_step(tokens, targets);
//
// On threads the stages share the model's parameters, so after training the model itself
// holds the trained weights; elsewhere coordinator().fetch_state() brings them back. With
// config.replicas = r > 1, r copies of the pipeline train side by side on shares of each
// batch and stay equal bit for bit. Under MPI every rank builds the same model and constructs
// the Pipeline; rank 0 coordinates and trains, every other rank calls serve().
#include <memory>
#include <string>
#include <vector>

#include "nn/sequential.h"
#include "pipeline/coordinator.h"
#include "pipeline/launch.h"
#include "pipeline/partition.h"
#include "pipeline/stage.h"

namespace pipit {

class StageHost;

// The chunk layer ranges `config.partition` gives for `model`.
std::vector<LayerRange> partition_model(const Sequential& model, const PipelineConfig& config);
// Each layer's config as text: layers of the same kind cost the same on the same stage
// (what automatic rebalancing assumes).
std::vector<std::string> layer_kinds(const Sequential& model);

class Pipeline {
 public:
  // `optimizer_state` (a checkpoint's, or empty) restores every stage's optimizer. Starting
  // the stages fails with an Error naming what went wrong (a worker that cannot be reached or
  // refuses its stage, ranks that built different models), after releasing what it started.
  Pipeline(std::shared_ptr<Sequential> model, PipelineConfig config,
           Launch launch = Launch::threads(), const StateDict& optimizer_state = {});
  // Shuts the stages down: threads are waited for up to config.timeout (one still busy is
  // left running rather than hang the caller), workers are released, MPI ranks return from
  // serve().
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Whether this process coordinates: always, but on MPI ranks other than 0.
  bool is_coordinator() const { return coordinator_ != nullptr; }
  // A process that does not coordinate: runs its stage until the coordinator shuts it down.
  void serve();

  double train_step(const Tensor& input, const Tensor& target) {
    return coordinator().train_step(input, target);
  }
  Tensor forward(const Tensor& input) { return coordinator().forward(input); }
  // The loss of a held-out batch, forward only (Coordinator::evaluate).
  double evaluate(const Tensor& input, const Tensor& target) {
    return coordinator().evaluate(input, target);
  }
  // Moves layers between stages, between steps (Coordinator::remap): chunk c holds ranges[c]
  // afterwards. On threads, after every remap (this one or an automatic one) the model's
  // layers are the modules the stages now train.
  void remap(const std::vector<LayerRange>& ranges) { coordinator().remap(ranges); }
  // Moves `count` layers from global chunk `from` to its neighbour `to` (with v = 1 chunks
  // are stages): e.g. move_layers(1, 0, 3) hands stage 1's first 3 layers to stage 0.
  void move_layers(int from, int to, int64_t count) {
    remap(pipit::move_layers(chunk_ranges(), from, to, count));
  }
  const std::vector<LayerRange>& chunk_ranges() { return coordinator().chunk_ranges(); }
  Coordinator& coordinator();

  // The stages that run in this process: every one on threads, this rank's under MPI, none
  // with workers; and stage `endpoint` (stage s of replica k is k * p + s) among them.
  std::vector<Stage*> local_stages();
  Stage& stage(int endpoint);
  // This process's rank in an MPI job and the job's size; 0 and 1 elsewhere.
  int rank() const;
  int world_size() const;
  // How many of this process's gradient sums the transport made itself (MPI_Iallreduce).
  int64_t pair_sums() const;

 private:
  std::shared_ptr<Sequential> model_;
  std::unique_ptr<StageHost> host_;
  std::unique_ptr<Coordinator> coordinator_;  // destroyed before the host that carries it
};

}  // namespace pipit
