#include "pipeline/pipeline.h"

#include "pipeline/gradients/tied_parameters.h"
#include "pipeline/remote/worker_stages.h"
#include "pipeline/thread_stages.h"
#ifdef PIPIT_WITH_MPI
#include "pipeline/remote/mpi/mpi_stages.h"
#endif

namespace pipit {
namespace {

std::unique_ptr<StageHost> start_stages(const std::shared_ptr<Sequential>& model,
                                        const PipelineConfig& config,
                                        const std::vector<LayerRange>& ranges, Launch launch,
                                        const StateDict& optimizer_state) {
  switch (launch.kind) {
    case Launch::Kind::threads:
      return std::make_unique<ThreadStages>(model, config, ranges, optimizer_state);
    case Launch::Kind::workers:
      return std::make_unique<WorkerStages>(*model, config, ranges, std::move(launch.addresses),
                                            std::move(launch.tcp_options), optimizer_state);
    case Launch::Kind::mpi:
#ifdef PIPIT_WITH_MPI
      return std::make_unique<MpiStages>(*model, config, ranges, optimizer_state,
                                         std::move(launch.mpi_options));
#else
      throw Error("Pipeline: Launch::mpi needs pipit built with MPI (Open MPI was not found)");
#endif
  }
  throw Error("Pipeline: unknown launch kind");
}

}  // namespace

std::vector<LayerRange> partition_model(const Sequential& model, const PipelineConfig& config) {
  validate(config);
  PIPIT_CHECK(!config.rebalance.enabled || model.ties().empty(),
              "rebalancing: ", remap_refusal(model));
  if (!config.layer_counts.empty()) {
    return ranges_from_counts(config.layer_counts, model.size(),
                              static_cast<size_t>(config.stages) * config.chunks_per_stage);
  }
  if (config.partition == "parameters") {
    return partition_by_parameters(model, config.stages, config.chunks_per_stage);
  }
  return stage_layer_ranges(model.size(), config.stages, config.chunks_per_stage);
}

std::vector<std::string> layer_kinds(const Sequential& model) {
  std::vector<std::string> kinds;
  for (size_t i = 0; i < model.size(); ++i) kinds.push_back(model[i]->config().dump());
  return kinds;
}

Pipeline::Pipeline(std::shared_ptr<Sequential> model, PipelineConfig config, Launch launch,
                   const StateDict& optimizer_state)
    : model_(std::move(model)) {
  PIPIT_CHECK(model_ != nullptr, "Pipeline: the model is null");
  std::vector<LayerRange> ranges = partition_model(*model_, config);
  host_ = start_stages(model_, config, ranges, std::move(launch), optimizer_state);
  const std::shared_ptr<Communicator> endpoint = host_->coordinator_endpoint();
  if (!endpoint) return;
  const int endpoints = config.stages * config.replicas;
  const bool rebalance = config.rebalance.enabled;
  try {
    coordinator_ = std::make_unique<Coordinator>(endpoint, std::move(config), std::move(ranges));
    coordinator_->refuse_remaps(remap_refusal(*model_));
    if (rebalance) coordinator_->enable_rebalancing(layer_kinds(*model_));
    host_->coordinate(*coordinator_);
  } catch (...) {
    // The stages are running: they stop before the error goes on.
    for (int e = 0; e < endpoints; ++e) endpoint->send(e, Message(MessageKind::Shutdown, 0));
    host_->stop();
    throw;
  }
}

Pipeline::~Pipeline() {
  if (coordinator_) coordinator_->shutdown();
  host_->stop();
}

void Pipeline::serve() {
  PIPIT_CHECK(!coordinator_, "Pipeline: serve() is for MPI ranks other than 0; this one trains");
  host_->serve();
}

Coordinator& Pipeline::coordinator() {
  PIPIT_CHECK(coordinator_ != nullptr, "Pipeline: rank ", rank(),
              " has no coordinator (rank 0 trains; the others call serve())");
  return *coordinator_;
}

std::vector<Stage*> Pipeline::local_stages() {
  return host_->stages();
}

Stage& Pipeline::stage(int endpoint) {
  for (Stage* stage : host_->stages()) {
    const StageSpec& spec = stage->spec();
    if (spec.replica * spec.stages + spec.stage == endpoint) return *stage;
  }
  throw Error(detail::concat("Pipeline: endpoint ", endpoint, " runs in no stage of this process"));
}

int Pipeline::rank() const {
  return host_->rank();
}

int Pipeline::world_size() const {
  return host_->world_size();
}

int64_t Pipeline::pair_sums() const {
  return host_->pair_sums();
}

}  // namespace pipit
