#pragma once
// MpiStages: SPMD pipelines under mpirun or srun (Launch::mpi). Every rank runs the same
// program, builds the same model from the same config and seed, and constructs its Pipeline
// from it: each rank keeps one stage of one replica (world size = stages x replicas; with one
// replica rank s is stage s; with r replicas rank s * r + k runs stage s of replica k, or with
// PipelineConfig::rank_layout "pipelines" rank k * p + s does), and rank 0 (stage 0 of replica
// 0) also runs the Coordinator beside its stage. Nothing is shipped and nobody starts workers
// by hand. At start-up the ranks compare a fingerprint of the model's config and weights and of
// the pipeline config; a rank that differs is named and every rank throws. Only rank 0 trains:
// its train_step needs the data; every other rank calls serve(), which returns when rank 0's
// pipeline goes. Replicas sum their gradients with comm/all_reduce.h's chain over MPI
// messages; with two replicas and MpiOptions::pair_replicas each stage's pair uses
// MPI_Iallreduce instead (the same bits: a + b == b + a; MPI does not fix a sum of three's
// order).
//   mpirun -np 4 build/train_gpt --launcher mpi ...
#include <memory>
#include <thread>

#include "comm/mpi/mpi_communicator.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/stage_host.h"

namespace pipit {

class MpiStages final : public StageHost {
 public:
  MpiStages(const Sequential& model, const PipelineConfig& config,
            const std::vector<LayerRange>& ranges, const StateDict& optimizer_state,
            MpiOptions options);
  // Joins rank 0's stage thread; the transport goes last, leaving MPI (or abandoning it when
  // an error unwinds this rank).
  ~MpiStages() override;

  std::shared_ptr<Communicator> coordinator_endpoint() override;
  std::vector<Stage*> stages() override { return {stage_.get()}; }
  void serve() override;
  void stop() override;
  int rank() const override { return transport_->rank(); }
  int world_size() const override { return transport_->world_size(); }
  int64_t pair_sums() const override { return transport_->pair_sums(); }

 private:
  std::shared_ptr<MpiTransport> transport_;
  std::shared_ptr<Stage> stage_;
  std::thread stage_thread_;  // rank 0: its stage runs beside the coordinator
};

}  // namespace pipit
