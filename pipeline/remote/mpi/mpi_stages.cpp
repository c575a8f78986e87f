#include "pipeline/remote/mpi/mpi_stages.h"

#include "pipeline/gradients/replica_group.h"
#include "serialize/module_fingerprint.h"

namespace pipit {
namespace {

// What every rank must agree on: the model's config and weights, and how it is pipelined.
std::string fingerprint(const Sequential& model, const PipelineConfig& c) {
  const nlohmann::json pipeline = {{"stages", c.stages},
                                   {"replicas", c.replicas},
                                   {"shard_optimizer", c.shard_optimizer},
                                   {"rank_layout", c.rank_layout},
                                   {"microbatches", c.microbatches},
                                   {"chunks", c.chunks_per_stage},
                                   {"schedule", c.schedule},
                                   {"partition", c.partition},
                                   {"layer_counts", c.layer_counts},
                                   {"loss", c.loss},
                                   {"optimizer", c.optimizer},
                                   {"dtype", c.dtype},
                                   {"recompute", c.recompute},
                                   {"max_deferred", c.max_deferred},
                                   {"schedule_table", c.schedule_table}};
  return module_fingerprint(model) + "|" + pipeline.dump();
}

}  // namespace

MpiStages::MpiStages(const Sequential& model, const PipelineConfig& config,
                     const std::vector<LayerRange>& ranges, const StateDict& optimizer_state,
                     MpiOptions options) {
  // Endpoint k * p + s (stage s of replica k, replica_group.h) runs on rank s * r + k, or with
  // the "pipelines" layout on rank k * p + s.
  const int p = config.stages, replicas = config.replicas, endpoints = p * replicas;
  const bool by_stage = config.rank_layout == "stages";
  const auto rank_of = [&](int e) { return by_stage ? (e % p) * replicas + e / p : e; };
  std::map<int, int> routes{{kCoordinator, 0}};
  for (int e = 0; e < endpoints; ++e) routes[e] = rank_of(e);
  if (replicas == 2 && options.pair_replicas && options.pair_sums.empty()) {
    for (int s = 0; s < p; ++s) {
      options.pair_sums.emplace_back(replica_endpoint(0, s, p), replica_endpoint(1, s, p));
    }
  }
  transport_ = MpiTransport::start(routes, options, fingerprint(model, config));
  PIPIT_CHECK(transport_->world_size() == endpoints, "Pipeline: ", config.stages, " stages x ",
              config.replicas, " replicas need ", endpoints, " MPI ranks, the job has ",
              transport_->world_size(), " (mpirun -np ", endpoints, ")");
  const int rank = transport_->rank();
  const int stage = by_stage ? rank / replicas : rank % p;
  const int replica = by_stage ? rank % replicas : rank / p;
  stage_ = std::make_shared<Stage>(
      make_stage_spec(model, ranges, config, stage, optimizer_state, replica),
      transport_->endpoint(replica_endpoint(replica, stage, p)));
  if (rank == 0) stage_thread_ = std::thread([stage = stage_] { stage->run(); });
}

MpiStages::~MpiStages() {
  if (stage_thread_.joinable()) stage_thread_.join();
}

std::shared_ptr<Communicator> MpiStages::coordinator_endpoint() {
  return transport_->rank() == 0 ? transport_->endpoint(kCoordinator) : nullptr;
}

void MpiStages::serve() {
  PIPIT_CHECK(transport_->rank() != 0, "Pipeline: serve() is for MPI ranks other than 0");
  stage_->run();
}

void MpiStages::stop() {
  if (stage_thread_.joinable()) stage_thread_.join();
}

}  // namespace pipit
