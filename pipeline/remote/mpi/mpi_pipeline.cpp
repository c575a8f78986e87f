#include "pipeline/remote/mpi/mpi_pipeline.h"

#include "pipeline/pipeline.h"
#include "serialize/module_fingerprint.h"

namespace pipit {
namespace {

// What every rank must agree on: the model's config and weights, and how it is pipelined.
std::string fingerprint(const Sequential& model, const PipelineConfig& c) {
  const nlohmann::json pipeline = {{"stages", c.stages},
                                   {"replicas", c.replicas},
                                   {"shard_optimizer", c.shard_optimizer},
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

MpiPipeline::MpiPipeline(const Sequential& model, PipelineConfig config,
                         const StateDict& optimizer_state, MpiOptions options) {
  const std::vector<LayerRange> ranges = partition_model(model, config);
  // Rank e runs endpoint e: stage e mod p of replica e / p (replica_group.h).
  const int endpoints = config.stages * config.replicas;
  std::map<int, int> routes{{kCoordinator, 0}};
  for (int e = 0; e < endpoints; ++e) routes[e] = e;
  transport_ = MpiTransport::start(routes, options, fingerprint(model, config));
  PIPIT_CHECK(transport_->world_size() == endpoints, "MpiPipeline: ", config.stages, " stages x ",
              config.replicas, " replicas need ", endpoints, " MPI ranks, the job has ",
              transport_->world_size(), " (mpirun -np ", endpoints, ")");
  const int r = transport_->rank();
  stage_ = std::make_shared<Stage>(
      make_stage_spec(model, ranges, config, r % config.stages, optimizer_state, r / config.stages),
      transport_->endpoint(r));
  if (r == 0) {
    stage_thread_ = std::thread([stage = stage_] { stage->run(); });
    coordinator_ = std::make_unique<Coordinator>(transport_->endpoint(kCoordinator),
                                                 std::move(config), ranges);
    coordinator_->refuse_remaps(remap_refusal(model));
  }
}

MpiPipeline::~MpiPipeline() {
  if (coordinator_) {
    coordinator_->shutdown();
    stage_thread_.join();
  }
  // transport_ goes last: it leaves MPI, or abandons it when an error unwinds this rank.
}

double MpiPipeline::train_step(const Tensor& input, const Tensor& target) {
  return coordinator().train_step(input, target);
}

Coordinator& MpiPipeline::coordinator() {
  PIPIT_CHECK(coordinator_ != nullptr, "MpiPipeline: rank ", rank(),
              " has no coordinator (rank 0 trains; the others call serve())");
  return *coordinator_;
}

void MpiPipeline::serve() {
  PIPIT_CHECK(!coordinator_, "MpiPipeline: serve() is for ranks other than 0");
  stage_->run();
}

}  // namespace pipit
