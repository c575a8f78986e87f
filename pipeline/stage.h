#pragma once
// Stage: one worker of the pipeline. It owns its model chunks, their optimizer and a
// Communicator, and serves steps: for each step it runs its schedule's tasks one at a time,
// each as soon as its input (an activation or a gradient) is in its inbox, and sends each
// result on to the neighbouring stage or to the coordinator.
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/split_backward.h"
#include "comm/communicator.h"
#include "nn/generate.h"
#include "nn/sequential.h"
#include "optim/optimizer.h"
#include "pipeline/rebalancing/layer_migration.h"
#include "pipeline/rebalancing/layer_timer.h"
#include "pipeline/replica_group.h"
#include "pipeline/schedules/task.h"
#include "pipeline/tied_parameters.h"
#include "pipeline/trace.h"
#include "tensor/stream.h"

namespace pipit {

// Everything a stage needs to run; a networked worker receives it as a stage package.
struct StageSpec {
  int stage = 0;
  int stages = 1;  // p
  // Which copy of the pipeline this stage belongs to, of how many (PipelineConfig::replicas):
  // its endpoint is replica * p + stage, and it sums its gradients with the same stage of
  // every other replica after each step's last backward (replica_group.h).
  int replica = 0;
  int replicas = 1;
  // ZeRO-1 over the replica group (PipelineConfig::shard_optimizer): the optimizer holds this
  // replica's share of the parameters (ReplicaGroup::shard_owners) and the group gathers the
  // updated ones after each step.
  bool shard_optimizer = false;
  int chunks_per_stage = 1;  // v
  std::string schedule = "1f1b";
  std::string schedule_table;  // for schedule "table"
  // Keep only each chunk's input and run its forward again before the backward.
  bool recompute = false;
  int max_deferred = 0;  // PipelineConfig::max_deferred
  // Local chunk l is global chunk global_chunk(stage, l, p, placement_of(schedule))
  // (pipeline/schedules/task.h): l * p + stage, or with "zbv" stage and then 2p - 1 - stage.
  std::vector<std::shared_ptr<Sequential>> chunks;
  nlohmann::json optimizer;
  // Restored into the optimizer when not empty: "step" and the entries of this stage's
  // parameters ("<param>.<buffer>"); entries of other stages' parameters are ignored, so a
  // whole model's optimizer state (a checkpoint's) can be given to every stage.
  StateDict optimizer_state;
  // Where the chunks and their optimizer live, and the autocast dtype (f32: off) of the
  // stage's thread.
  Device device = Device::cpu();
  DType compute_dtype = DType::f32;
  // > 1: every layer takes this many times as long (pipeline/rebalancing/layer_timer.h), as on a
  // slower machine.
  double slowdown = 1.0;
  // The model's ties that this stage holds a side of (pipeline/tied_parameters.h).
  std::vector<TiedParameter> ties;
};

class Stage {
 public:
  Stage(StageSpec spec, std::shared_ptr<Communicator> communicator);
  // Serves steps until a Shutdown message arrives, the coordinator's connection is lost or the
  // communicator closes. A task that
  // throws is reported to the coordinator as a StageError; the stage then awaits the next step.
  void run();

  const StageSpec& spec() const { return spec_; }
  Optimizer& optimizer() { return *optimizer_; }

 private:
  // Returns false once the stage should stop.
  bool handle(Message message);
  // Whether the message comes from the endpoint that may send it (see dispatch).
  bool accepts(const Message& message) const;
  void report_error(const std::string& message);
  bool dispatch(Message message);
  void begin_step(const Message& message);
  // Data of a later step (activations, gradients, layers) that overtook its StepBegin or
  // RemapPrepare: kept, at most kMaxEarlyMessages, until that step begins.
  void keep_early(Message message);
  std::vector<Message> take_early(MessageKind kind);
  void run_ready_tasks();
  void forward(const Task& task, const Tensor& input);
  void backward(const Task& task, const Tensor& grad);
  void input_grad(const Task& task, const Tensor& grad);
  void weight_grad(const Task& task);
  struct Stashed;
  // The stash entry of a task's forward, checked against its gradient; with recompute, the
  // forward runs again here.
  Stashed take_stashed(const Task& task, const Tensor& grad);
  // The chunk's forward on a leaf made from `input`, building the graph its backward needs.
  void forward_with_grad(const Task& task, const Tensor& input, Stashed& stashed);
  void send_input_grad(const Task& task, const Tensor& leaf);
  // After the step's last task: sends this stage's side of each remote tie to its peer, sums
  // what is here, and finishes the step once every peer's side has arrived.
  void exchange_tied_gradients();
  void sum_tied_gradients();
  // Then, with replicas, sums the gradients over the replica group, and finishes the step once
  // the sums are in.
  void reduce_over_replicas();
  // With replicas, at a training step's start: the order the gradients are summed in (chunk by
  // chunk as their last B or W task ends, each chunk's last layer first; tied parameters last)
  // and the group's sum begun.
  void plan_gradient_sum();
  // The first `count` parameters of that order have their final gradients: they go on.
  void share_gradients(size_t count);
  // During a chunk's last B or W on the CPU (an AccumulationHook): `leaf` has its final
  // gradient; the leading final ones go on at once, layer by layer, and the replicas' segments
  // that have come are summed, while the backward goes on.
  void gradient_final(const AutogradMeta& leaf);
  void pump_replica_segments();
  // The next message: one set aside by pump_replica_segments, or the communicator's.
  Message next_message();
  void receive_replica_segment(const Message& message);
  // Ends the step once the replicas' sum is in, the tasks are done and the ties summed.
  void finish_step_when_summed();
  Tensor parameter(const std::string& name) const;
  void finish_step();
  void apply_optimizer(const Message& message);
  // ZeRO-1: OptimizerDone once this stage updated its parameters and has the other replicas'.
  void finish_update();
  // Every parameter's gradient, not only those the (sharded) optimizer updates.
  void zero_grad();
  // Pipelined generation (pipeline/pipelined_generation.h): caches for the chunks, then each
  // GenerateStep runs through this stage's consecutive chunks and goes on to the next stage's.
  void begin_generation(const Message& message);
  void generation_step(const Message& message);
  void send_state(int64_t step);
  // The profiled step's layer timings, with their output and state bytes.
  std::vector<LayerTiming> layer_timings() const;
  // Remapping (Coordinator::remap): prepare aside, then commit. With the optimizer sharded
  // (ZeRO-1) the replicas of the stage first pool their shares of its state (State messages
  // between the members), so that moved layers carry all of theirs; adopt() shares it out anew.
  void prepare_remap(const Message& message);
  void pool_optimizer_state(const Message& share);
  void start_migration();
  void advance_remap();
  void commit_remap();
  // Makes `chunks` the stage's chunks, with a fresh optimizer of the same config over their
  // parameters, loaded from `optimizer_state` when it is not empty.
  void adopt(std::vector<std::shared_ptr<Sequential>> chunks, const nlohmann::json& optimizer,
             const StateDict& optimizer_state);
  // A received tensor on this stage's device, its memory guarded for our stream's use.
  Tensor on_device(const Tensor& received);
  // Sends a result, making its tensors readable by the receiver (see Communicator).
  void send(int to, Message message);
  void reset();
  Sequential& chunk(int global_chunk);
  int last_chunk() const { return spec_.stages * spec_.chunks_per_stage - 1; }
  // The endpoint of stage `stage` of this stage's replica, and this stage's own.
  int endpoint(int stage) const { return replica_endpoint(spec_.replica, stage, spec_.stages); }
  int me() const { return endpoint(spec_.stage); }
  // "stage s", or "stage s of replica k", for errors.
  std::string name() const { return endpoint_name(me(), spec_.stages, spec_.replicas); }
  // The endpoint of the stage (of this replica) a chunk lives on, under the schedule's
  // placement.
  int endpoint_of(int chunk) const;

  StageSpec spec_;
  std::shared_ptr<Communicator> comm_;
  // The stream run() queues this stage's GPU work on (a stream of its own on a CUDA device).
  Stream stream_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Tensor> parameters_;
  // parameters_ without the copies of tied parameters, which the source's stage counts.
  std::vector<Tensor> norm_parameters_;

  // The step in progress.
  int64_t step_ = -1;
  bool active_ = false;
  bool training_ = false;
  bool record_trace_ = false;
  bool report_grad_norm_ = false;
  int microbatches_ = 0;
  std::vector<Task> tasks_;
  size_t next_task_ = 0;
  // Tied gradients: sent to the peers this step, and the peers' sides that arrived, by tie.
  bool tied_sent_ = false;
  bool tied_summed_ = false;  // this step's tied gradients are summed (tied_parameters.h)
  bool updated_ = false;      // ZeRO-1: this stage's own update is done, the others' awaited
  std::map<int, Tensor> peer_tied_;
  // With replicas: this stage's group and the step's gradient sum.
  std::optional<ReplicaGroup> replica_group_;
  double sum_started_us_ = 0;
  std::vector<Tensor> sum_order_;
  std::map<size_t, size_t> ready_after_task_;  // task index -> parameters final after it
  bool sum_shared_ = false;
  size_t shared_count_ = 0;  // the leading parameters of sum_order_ gone to the sum
  std::map<const AutogradMeta*, size_t> sum_position_;  // a chunk parameter's place in it
  std::vector<bool> final_;                             // by place: its gradient is final
  // Messages taken from the communicator during a task (pump_replica_segments), in order.
  std::deque<Message> interrupted_;
  // Inputs that arrived, by (phase, microbatch, chunk).
  std::map<std::tuple<Phase, int, int>, Tensor> inputs_;
  // Data of a later step that arrived before that step's StepBegin.
  std::vector<Message> early_;
  static constexpr size_t kMaxEarlyMessages = 1 << 16;
  // A forward awaiting its backward: its input leaf and output, and where a split backward's
  // I stops (the leaf, or the first layer's output when the input needs no gradient); with
  // recompute only the input, and where the chunk's random streams stood before it.
  struct Stashed {
    Tensor leaf, output, split_at;
    std::vector<uint64_t> rng_offsets;
  };
  // By (microbatch, chunk).
  std::map<std::pair<int, int>, Stashed> stash_;
  // Under bf16/f16 autocast, each weight rounded once for the whole step rather than once per
  // microbatch (and again in each recompute): open from a step's first forward to its
  // finish_step, before the optimizer changes the weights. The stage's thread opens and closes
  // it (CastCache is per thread).
  std::optional<CastCache> weights_rounded_;
  // When the running task recomputed its forward first: that part's start and end, for the
  // trace.
  std::optional<std::pair<double, double>> recomputed_;
  // A remap in progress, and its result once every layer is here. Before it starts under
  // ZeRO-1: its RemapPrepare, the state pooled so far and the members' shares still to come.
  std::optional<Message> remap_prepare_;
  StateDict pooled_state_;
  int shares_awaited_ = 0;
  std::unique_ptr<LayerMigration> migration_;
  std::optional<LayerMigration::Result> staged_;
  // Per local chunk, while generating.
  std::vector<std::unique_ptr<CachedLayers>> generation_;
  // Weight gradients (W) awaiting their turn after their I: (microbatch, chunk) -> work.
  std::map<std::pair<int, int>, DeferredGradients> deferred_;
  size_t peak_stashed_ = 0;
  size_t peak_deferred_ = 0;
  Trace trace_;
  LayerTimer timer_;
  std::vector<double> chunk_busy_us_;  // per local chunk, this step
};

}  // namespace pipit
