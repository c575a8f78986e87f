#pragma once
// Message: everything stages and the coordinator say to each other. Data messages carry
// tensors (activations forward, gradients backward); control messages carry JSON in `meta`.
// The step number lets a receiver drop what is left of an aborted step.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

enum class MessageKind : uint8_t {
  // Coordinator -> stage.
  StepBegin = 1,  // meta: {"train": bool, "microbatches": m}
  OptimizerStep,  // meta: {"lr": number or null, "grad_scale": factor applied first}
  Abort,          // drop the step's state; the step number says which
  Shutdown,
  FetchState,  // reply with a State message
  State,  // tensors: weights then optimizer state; meta: {"weights": [names], "optimizer": [names]}
  // Between neighbouring stages, and coordinator <-> first and last stage.
  Activation,  // tensors: {activation}; to the coordinator: the model's output
  Gradient,    // tensors: {dL/dactivation}
  // Stage -> coordinator.
  StageDone,      // meta: {"grad_norm_sq", "peak_stashed", "trace": [...]}
  OptimizerDone,  // the stage applied the optimizer step
  StageError,     // meta: {"message": what went wrong}
  // Connection management (used by networked communicators).
  Hello,
  StagePackage,
  Ready,
  Start,
  Heartbeat,
  // Made locally by a networked communicator, never sent: a peer's connection failed.
  PeerLost,  // meta: {"peer": id, "address": "host:port", "reason": text}
  // Layer remapping (pipeline/layer_migration.h), between steps.
  RemapPrepare,   // coordinator -> stage: meta {"from": [layer counts], "to": [layer counts]}
  LayerTransfer,  // stage -> neighbouring stage: layers crossing one chunk boundary
  RemapReady,     // stage -> coordinator: the stage holds every layer of its new chunks
  RemapCommit,    // coordinator -> stage: train with the new chunks from now on
  RemapDone,      // stage -> coordinator: committed
  // Parameter server (ps/): worker <-> server shard.
  PsJoin,        // worker -> server: send me the parameters
  PsParameters,  // server -> worker: tensors: the shard's parameters at a version
  PsPush,        // worker -> server: tensors: gradients computed from a version
  PsLeave,       // worker -> server: no more pushes from me
  PsError,       // server -> worker: the run cannot go on, or a push was refused
  PsPackage,     // launcher -> pipit-worker: serve a shard or worker role (ps/ps_package.h)
  // Tied parameters (pipeline/tied_parameters.h), stage -> stage after a step's backward.
  TiedGradient,  // microbatch: the tie's index; tensors: {this stage's gradient of its side}
  // Generation with KV caches on the stages (pipeline/pipelined_generation.h).
  GenerateBegin,  // coordinator -> stage: meta {"batch", "capacity", "padding": [per row]}
  GenerateStep,   // along the chunks like Activation: meta {"start"}; tensors: {tokens or hidden}
  GenerateEnd,    // coordinator -> stage: drop the caches; stage -> coordinator: done
  // All-reduce (comm/all_reduce.h), member -> member: step: the all-reduce's tag;
  // microbatch: the segment; chunk: 0 (partial sum) or 1 (result); tensors: {the segment}.
  AllReduceSegment,
};

const char* message_kind_name(MessageKind kind);

struct Message {
  Message() = default;
  Message(MessageKind kind, int64_t step, int microbatch = 0, int chunk = 0,
          std::vector<Tensor> tensors = {})
      : kind(kind), step(step), microbatch(microbatch), chunk(chunk), tensors(std::move(tensors)) {}

  MessageKind kind = MessageKind::Heartbeat;
  int64_t step = 0;
  int microbatch = 0;
  int chunk = 0;
  std::vector<Tensor> tensors;
  nlohmann::json meta = nlohmann::json::object();
  int from = 0;  // set by the communicator on receipt: the sender's endpoint id
};

}  // namespace pipit
