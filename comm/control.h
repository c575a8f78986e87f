#pragma once
// Typed control messages. Each struct is the meta of one MessageKind; `to_message` writes it
// and the matching `read_*` reads it back, checking every field's presence, type and range
// and refusing fields it does not know, so a peer's message is either exactly understood or
// a ControlError naming the kind and the field. Kinds without a struct (Abort, Shutdown,
// FetchState, OptimizerDone, Ready, Start, Heartbeat, RemapReady, RemapCommit, RemapDone)
// carry an empty object (read_empty).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/message.h"

namespace pipit {

// A received control message does not say what its kind requires.
class ControlError : public Error {
 public:
  using Error::Error;
};

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
  int phase = 0;  // pipeline/task.h's Phase: 0 F, 1 B, 2 I, 3 W, 4 R (recomputation)
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

// Stage -> coordinator: the step failed here (or the stage could not be built).
struct StageError {
  std::string message;
  int stage = -1;  // -1: not yet known (a worker whose package was refused)
};

// Stage -> coordinator: the message's tensors are these weights, then these optimizer entries.
struct StateReply {
  std::vector<std::string> weights;
  std::vector<std::string> optimizer;
};

// Made locally by a networked communicator: a peer's connection failed.
struct PeerLost {
  int peer = 0;
  std::string address;
  std::string reason;
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
Message to_message(const StageError& error, int64_t step);
Message to_message(const StateReply& state, int64_t step, std::vector<Tensor> tensors);
Message to_message(const PeerLost& lost);
Message to_message(const RemapPrepare& prepare, int64_t step);
Message to_message(const LayerTransfer& transfer, int64_t step, int chunk,
                   std::vector<Tensor> tensors);

StepBegin read_step_begin(const Message& message);
OptimizerStep read_optimizer_step(const Message& message);
StageDone read_stage_done(const Message& message);
StageError read_stage_error(const Message& message);
StateReply read_state_reply(const Message& message);  // also checks the tensor count
PeerLost read_peer_lost(const Message& message);
RemapPrepare read_remap_prepare(const Message& message);
LayerTransfer read_layer_transfer(const Message& message);  // also checks the tensor count
void read_empty(const Message& message);

// Whether a message of this kind only a coordinator may send (stages ignore it from others).
bool is_coordinator_command(MessageKind kind);

// Bounds on what a peer can make a stage allocate through a control message.
constexpr int kMaxMicrobatches = 1 << 16;
constexpr size_t kMaxControlString = 1 << 16;
constexpr size_t kMaxControlList = 1 << 22;

}  // namespace pipit
