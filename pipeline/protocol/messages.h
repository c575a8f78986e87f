#pragma once
// Pipeline's protocol: the kinds of message a coordinator and its stages exchange, and the
// typed meta of the control ones. Each struct is the meta of one kind; `to_message` writes
// it and the matching `read_*` reads it back, checking every field and refusing fields it
// does not know (comm/control.h). Kinds without a struct (Abort, FetchState, OptimizerDone,
// RemapReady, RemapCommit, RemapDone) carry an empty object (read_empty). Generation's
// messages live in generate_messages.h, stage packages' in remote/stage_package.h.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/control.h"

namespace pipit {

// Pipeline's message kinds (comm/message.h's registry; values fixed on the wire).
struct PipelineKind {
  // Coordinator -> stage.
  static constexpr MessageKind StepBegin{1};      // StepBegin
  static constexpr MessageKind OptimizerStep{2};  // OptimizerStep
  static constexpr MessageKind Abort{3};          // drop the step's state (its step number)
  static constexpr MessageKind FetchState{5};     // reply with a State message (StateReply)
  // Between neighbouring stages, and coordinator <-> first and last stage.
  static constexpr MessageKind Activation{7};  // tensors: {activation}; last: the output
  static constexpr MessageKind Gradient{8};    // tensors: {dL/dactivation}
  // Stage -> coordinator.
  static constexpr MessageKind StageDone{9};       // StageDone
  static constexpr MessageKind OptimizerDone{10};  // the stage applied the optimizer step
  // Launcher -> bare worker: build and run a stage (remote/stage_package.h).
  static constexpr MessageKind StagePackage{13};
  // Layer remapping between steps (rebalancing/layer_migration.h).
  static constexpr MessageKind RemapPrepare{18};   // coordinator -> stage: RemapPrepare
  static constexpr MessageKind LayerTransfer{19};  // stage -> neighbour: LayerTransfer
  static constexpr MessageKind RemapReady{20};     // stage -> coordinator: holds its new chunks
  static constexpr MessageKind RemapCommit{21};    // coordinator -> stage: train with them
  static constexpr MessageKind RemapDone{22};      // stage -> coordinator: committed
  // Tied parameters (tied_parameters.h), stage -> stage after a step's backward.
  // microbatch: the tie's index; tensors: {this stage's gradient of its side}.
  static constexpr MessageKind TiedGradient{29};
  // Generation with KV caches on the stages (protocol/generate_messages.h).
  static constexpr MessageKind GenerateBegin{30};  // coordinator -> stage: GenerateBegin
  static constexpr MessageKind GenerateStep{31};   // along the chunks like Activation
  static constexpr MessageKind GenerateEnd{32};    // coordinator -> stage, and the reply
  // ZeRO-1 (replica_group.h), a stage -> the same stage of the next replica, after the
  // optimizer step: microbatch: the replica that updated them; tensors: its parameters.
  static constexpr MessageKind ParameterShard{34};
};

// Registers PipelineKind's names; every file that sees the kinds runs it before main.
bool register_pipeline_message_kinds();
inline const bool kPipelineMessageKindsRegistered = register_pipeline_message_kinds();

// Coordinator -> stages: a step begins.
struct StepBegin {
  bool train = true;
  int microbatches = 1;
  bool trace = false;      // report each task's start and end
  bool grad_norm = false;  // report the squared gradient norm
  bool profile = false;    // report each layer's times (StageDone::layers)
};

// Coordinator -> stages: apply (or, with skip, drop) this step's gradients.
struct OptimizerStep {
  std::optional<double> lr;  // the learning rate from now on; none: unchanged
  double grad_scale = 1;     // gradients are multiplied by this first (unscaling, clipping)
  bool skip = false;         // an inf/NaN gradient: zero the gradients instead
};

// One task's execution, as a stage reports it.
struct TaskTiming {
  int microbatch = 0;
  int chunk = 0;
  // pipeline/schedules/task.h's Phase: 0 F, 1 B, 2 I, 3 W, 4 R (recomputation), 5 S (the
  // gradient sum over replicas).
  int phase = 0;
  double start_us = 0;
  double end_us = 0;
};

// One layer's share of a step on its stage (a profiled step): its forward and backward
// times summed over the microbatches, the bytes of its output per microbatch (what crosses
// a stage boundary cut after it) and the bytes of its state (weights and optimizer entries:
// what a remap moves).
struct LayerTiming {
  int64_t layer = 0;
  double forward_us = 0;
  double backward_us = 0;
  double output_bytes = 0;
  double state_bytes = 0;
};

// Stage -> coordinator: the stage ran its whole schedule for the step.
struct StageDone {
  int64_t peak_stashed = 0;
  std::optional<double> grad_norm_sq;
  std::vector<TaskTiming> trace;
  std::vector<double> chunk_busy_us;  // per local chunk: time in its tasks
  std::vector<LayerTiming> layers;    // profiled steps only
  int64_t peak_deferred = 0;          // most weight gradients (W) kept after their I at once
};

// Coordinator -> stages: move layers so that global chunk c holds to[c] layers instead of
// from[c] (contiguous, in model order); the stage answers RemapReady, then RemapCommit makes
// the new chunks the ones it trains.
struct RemapPrepare {
  std::vector<int64_t> from;
  std::vector<int64_t> to;
};

// Stage -> neighbouring stage: the layers that cross the boundary between from_chunk and the
// message's chunk (its neighbour). The tensors are, layer after layer, its weights and then
// its optimizer entries, in the order named here.
struct LayerTransfer {
  struct Layer {
    int64_t index = 0;  // in the whole model
    nlohmann::json config;
    std::vector<std::string> weights;    // full-model names ("13.attn.qkv.weight")
    std::vector<std::string> optimizer;  // "<weight>.<buffer>"
  };
  int from_chunk = 0;
  std::vector<Layer> layers;
};

Message to_message(const StepBegin& step_begin, int64_t step);
Message to_message(const OptimizerStep& optimizer_step, int64_t step);
Message to_message(const StageDone& done, int64_t step);
Message to_message(const RemapPrepare& prepare, int64_t step);
Message to_message(const LayerTransfer& transfer, int64_t step, int chunk,
                   std::vector<Tensor> tensors);

StepBegin read_step_begin(const Message& message);
OptimizerStep read_optimizer_step(const Message& message);
StageDone read_stage_done(const Message& message);
RemapPrepare read_remap_prepare(const Message& message);
LayerTransfer read_layer_transfer(const Message& message);  // also checks the tensor count

}  // namespace pipit
