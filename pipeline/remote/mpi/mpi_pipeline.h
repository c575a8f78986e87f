#pragma once
// MpiPipeline: SPMD pipelines under mpirun or srun. Every rank runs the same program, builds
// the same model from the same config and seed, and constructs an MpiPipeline from it: each
// rank keeps one stage of one replica (world size = stages x replicas; with one replica rank
// s is stage s; with r replicas rank s * r + k runs stage s of replica k, or with
// PipelineConfig::rank_layout "pipelines" rank k * p + s does), rank 0 (stage 0 of replica
// 0) also runs the Coordinator on a thread beside its stage. Nothing is shipped and nobody starts
// workers by hand. At start-up the ranks compare a fingerprint of the model's config and weights
// and of the pipeline config; a rank that differs is named and every rank throws. Only rank 0
// trains: its train_step needs the data; every other rank calls serve(), which returns when rank
// 0's pipeline goes. Replicas sum their gradients with comm/all_reduce.h's chain over MPI
// messages; with two replicas and MpiOptions::pair_replicas each stage's pair uses
// MPI_Iallreduce instead (the same bits: a + b == b + a; MPI does not fix a sum of three's order).
//   mpirun -np 4 build/train_gpt --launcher mpi ...
#include <memory>
#include <thread>

#include "comm/mpi/mpi_communicator.h"
#include "nn/sequential.h"
#include "pipeline/coordinator.h"
#include "pipeline/stage.h"

namespace pipit {

class MpiPipeline {
 public:
  // `optimizer_state` (a checkpoint's, or empty) restores each stage's optimizer.
  MpiPipeline(const Sequential& model, PipelineConfig config, const StateDict& optimizer_state = {},
              MpiOptions options = {});
  ~MpiPipeline();  // rank 0 shuts the stages down; every rank then leaves MPI
  MpiPipeline(const MpiPipeline&) = delete;
  MpiPipeline& operator=(const MpiPipeline&) = delete;

  int rank() const { return transport_->rank(); }
  int world_size() const { return transport_->world_size(); }
  int local_rank() const { return transport_->local_rank(); }
  // What this rank runs (StageSpec::stage and replica).
  const StageSpec& stage_spec() const { return stage_->spec(); }
  const MpiTransport& transport() const { return *transport_; }
  bool is_coordinator() const { return rank() == 0; }

  // Rank 0 only.
  double train_step(const Tensor& input, const Tensor& target);
  Coordinator& coordinator();
  // Other ranks: runs this rank's stage until rank 0 shuts the pipeline down.
  void serve();

 private:
  std::shared_ptr<MpiTransport> transport_;
  std::shared_ptr<Stage> stage_;
  std::unique_ptr<Coordinator> coordinator_;
  std::thread stage_thread_;  // rank 0: its stage runs beside the coordinator
};

}  // namespace pipit
