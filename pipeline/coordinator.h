#pragma once
// Coordinator: drives the stages of a pipeline through a Communicator. train_step splits a
// batch into microbatches, feeds them to stage 0, turns the last stage's outputs into loss
// gradients, waits for every stage to finish its schedule, then has every stage step its
// optimizer. The same Coordinator drives stages in threads or in worker processes.
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "loss/loss.h"
#include "optim/grad_scaler.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_config.h"
#include "pipeline/protocol/generate_messages.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/rebalancing/remap_trial.h"
#include "pipeline/trace.h"
#include "tensor/state_dict.h"

namespace pipit {

// What the stages reported about the last step.
struct StepStats {
  std::vector<int> peak_stashed;   // per stage: most microbatches awaiting their backward (B, I)
  std::vector<int> peak_deferred;  // per stage: most weight gradients (W) awaiting their turn
  double grad_norm = 0;            // global gradient norm before clipping (when clipping)
  bool skipped = false;            // f16: a gradient overflowed and the update was dropped
  double loss_scale = 1;           // f16: the scale the step's loss gradients were sent with
  std::vector<double> busy_us;     // per stage: time in its tasks
  // Profiled steps (PipelineConfig::profile_every): every layer's times, in layer order.
  std::vector<LayerTiming> layers;
  // Automatic rebalancing: the remap made after this step and how long it paused training,
  // and the policy's verdict on this step.
  std::optional<Decision> rebalanced;
  double remap_ms = 0;
  std::string rebalance_verdict;
  // Per microbatch: the loss and its gradient here, plus (over a wire) the output's and the
  // gradient's transfers at the rebalancing link rate (LayerCosts::loss_ms).
  double loss_ms = 0;
};

// What a profiled step's StepStats say to the cost model: per layer, ms per microbatch of
// forward and backward, output and state bytes; and the loss the last stage waited for.
LayerCosts layer_costs(const StepStats& stats, int microbatches);

class Coordinator {
 public:
  // `ranges`: the layers each global chunk of the stages holds now (partition_model's).
  Coordinator(std::shared_ptr<Communicator> communicator, PipelineConfig config,
              std::vector<LayerRange> ranges);

  // One optimizer step on (input, target); returns the mean of the microbatch losses. The
  // gradients sent back are compute_gradient / m, so the accumulated gradients are those of
  // the full batch's mean loss. A stage failure or a silent pipeline throws an Error naming
  // the stage and the cause. Before the optimizer step nothing has changed and the stages
  // are ready for the next step; a failure during it makes the pipeline inconsistent
  // (consistent() turns false) and every later call throws.
  double train_step(const Tensor& input, const Tensor& target);
  // Pipelined inference (no gradients, layers in eval mode): the outputs of the m
  // microbatches concatenated in order.
  Tensor forward(const Tensor& input);
  // The loss of (input, target) through the same stages, forward only and in eval mode, with
  // no gradient and no update: the mean of the microbatch losses, as train_step reports it.
  // What a validation loss is.
  double evaluate(const Tensor& input, const Tensor& target);

  // Generation with KV caches on the stages (pipeline/generation/pipelined_generation.h, through
  // generate()): the stages allocate caches for their chunks' blocks; each generate_step runs
  // tokens [B, T] at positions [start, start + T) through every chunk and returns the last
  // position's logits, f32 [B, vocab] on the CPU; generate_end drops the caches. Failures
  // throw as train_step's do.
  void generate_begin(const GenerateBegin& begin);
  Tensor generate_step(const Tensor& tokens, int64_t start);
  void generate_end();

  // Moves layers between the stages' chunks, between steps, so that chunk c holds ranges[c]
  // (p * v contiguous non-empty ranges covering the model): weights, optimizer state and
  // layer configs travel between neighbouring stages, and training goes on exactly as before.
  // Two phases: every stage gathers its new layers aside, then all commit. A failure before
  // the commit throws an Error naming the stage and the remap, and leaves the old partition
  // on every stage; a failure during the commit makes the pipeline inconsistent.
  void remap(const std::vector<LayerRange>& ranges);
  const std::vector<LayerRange>& chunk_ranges() const { return ranges_; }
  // Turns on config().rebalance: `layer_kinds[l]` says which layers cost the same on the same
  // stage (their configs, as Pipeline gives them on every transport).
  void enable_rebalancing(std::vector<std::string> layer_kinds);
  // Makes every later remap (and rebalancing) throw an Error saying `why`.
  void refuse_remaps(std::string why) { remap_refusal_ = std::move(why); }
  // Called after every committed remap, manual or automatic.
  void on_remap(std::function<void()> listener) { on_remap_ = std::move(listener); }

  // The learning rate every stage uses from the next optimizer step on.
  void set_lr(double lr) { lr_ = lr; }
  // Every stage's weights and optimizer state by name (the whole model's, for checkpoints).
  // Every stage's optimizer has a "step"; they agree, and one of them is kept.
  std::pair<StateDict, StateDict> fetch_state();
  // Tells every stage to stop serving.
  void shutdown();
  // False once a step failed after some stages had applied its optimizer step: every later
  // call then throws, telling the user to restore from a checkpoint.
  bool consistent() const { return inconsistent_.empty(); }

  const PipelineConfig& config() const { return config_; }
  const StepStats& last_step() const { return stats_; }
  // The f16 loss scaler (unused under other dtypes): its state_dict() goes into checkpoints.
  GradScaler& grad_scaler() { return scaler_; }
  // Every task of every step so far, when config.trace is on.
  const Trace& trace() const { return trace_; }
  void clear_trace() { trace_.clear(); }

 private:
  // The batch in m equal microbatches along dim 0.
  std::vector<Tensor> split_batch(const Tensor& batch, const char* what, int m) const;
  // Stage s of replica k is endpoint k * p + s (replica_group.h); endpoints() counts them.
  int endpoints() const { return config_.stages * config_.replicas; }
  // The microbatches of `input` forward through replica 0 (eval mode); each output is handed to
  // `on_output(microbatch, output)` as it arrives.
  void forward_each(const Tensor& input, const std::function<void(int, const Tensor&)>& on_output);
  // StepBegin to every stage of the first `replicas` replicas.
  void begin_step(bool train, int replicas);
  Message receive_step_message(const std::string& waiting_for);
  [[noreturn]] void fail_step(const std::string& message);
  void record_stage_done(const Message& message);
  double loss_scale() const;
  // The OptimizerStep every stage gets: unscaling, clipping, lr, or skip after an overflow.
  OptimizerStep optimizer_step();
  // The loss of microbatch `mb` (of n) from the last stage's output; its gradient goes back.
  double answer_output(const Message& output, const Tensor& target, int mb, int n);
  // Every stage applies the step's update and confirms; a failure here leaves the pipeline
  // inconsistent.
  void apply_optimizer_step();
  // To every stage of every replica, or of replica 0 only.
  void send_to_all(const Message& message);
  void send_to_replica0(const Message& message);
  void require_consistent() const;
  void remap_now(const std::vector<LayerRange>& ranges, const std::string& why);
  // Feeds a profiled step's layer times to the rebalancing policy, and remaps if it says so;
  // undoes an automatic remap whose steps turned out slower (RemapTrial).
  void rebalance(double step_ms);
  // Waits for one reply of `kind` from every stage of replica 0.
  // One `kind` message from each of the first `count` endpoints (replica 0's stages, or with
  // count = endpoints() every replica's).
  void await_all(MessageKind kind, const std::string& waiting_for, int count);
  // Entered by every public call that talks to the stages: a second caller (another thread
  // asking for a remap during a step) gets an error instead of a garbled exchange.
  class Busy;

  std::shared_ptr<Communicator> comm_;
  PipelineConfig config_;
  std::unique_ptr<Loss> loss_;
  int64_t step_ = 0;
  std::optional<double> lr_;
  double grad_norm_sq_ = 0;
  StepStats stats_;
  // Dynamic loss scaling when config_.dtype is f16; unused otherwise.
  GradScaler scaler_;
  Trace trace_;
  std::string inconsistent_;  // why the stages may disagree; empty while they agree
  std::vector<LayerRange> ranges_;
  std::optional<RebalancePolicy> policy_;
  std::vector<double> recent_step_ms_;  // the last window's step times, oldest first
  std::optional<RemapTrial> trial_;     // the last automatic remap, until judged
  int64_t trained_ = 0;                 // training steps so far: the policy's clock
  std::function<void()> on_remap_;
  std::string remap_refusal_;
  std::atomic<bool> busy_{false};
};

}  // namespace pipit
