#pragma once
// StageGradients: the part of a Stage (pipeline/stage.h) that makes a step's gradients final
// and applies them. After the step's last task it exchanges the gradients of tied parameters
// with the stage holding each tie's other side (tied_parameters.h); with replicas it sums the
// gradients over the replica group (replica_group.h) in buckets, each chunk's as soon as the
// task that finishes them is done, layer by layer during that task on the CPU; the step ends
// once both are in. On the coordinator's OptimizerStep it updates the parameters, and under
// ZeRO-1 gathers the other replicas' updated shares before it answers.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "optim/optimizer.h"
#include "pipeline/gradients/replica_group.h"
#include "pipeline/trace.h"

namespace pipit {

class Stage;

class StageGradients {
 public:
  // Registers the handlers of tied gradients, the replicas' sum and the optimizer's update.
  explicit StageGradients(Stage& stage);

  // A training step begins: the tied gradients that came before it; with replicas the order
  // the gradients are summed in (chunk by chunk as their last B or W task ends, each chunk's
  // last layer first; tied parameters last) and the group's sum begun.
  void begin_step();
  // Every task of the step is done: exchange and sum; the stage finishes the step when all is
  // in.
  void after_tasks();
  // The replicas' sum as a trace event, once it is done.
  std::optional<TraceEvent> sum_event() const;
  // Under ZeRO-1, of a stage's parameters (every member's in the same order), those this
  // replica's optimizer updates; else all of them.
  NamedParameters owned(NamedParameters parameters, const std::vector<Tensor>& tensors);
  // Whether `endpoint` is another member of this stage's replica group.
  bool member(int endpoint) const { return group_ && group_->member(endpoint); }
  void reset();

 private:
  bool accepts_tied(const Message& message) const;
  bool accepts_replica(const Message& message) const;
  bool receive_tied(Message message);
  bool receive_segment(Message message);
  bool receive_pair_sum(Message message);
  bool receive_parameters(Message message);
  bool apply_optimizer(Message message);
  void sum_tied_gradients();
  void reduce_over_replicas();
  void plan_sum();
  // The first `count` parameters of the sum's order have their final gradients: they go on.
  void share(size_t count);
  // During a chunk's last B or W on the CPU: `leaf` has its final gradient; the leading final
  // ones go on at once, layer by layer, and the replicas' segments that have come are summed,
  // while the backward goes on.
  void gradient_final(const AutogradMeta& leaf);
  void finish_when_summed();
  // ZeRO-1: OptimizerDone once this stage updated its parameters and has the other replicas'.
  void finish_update();
  Tensor parameter(const std::string& name) const;
  bool training() const;

  Stage& stage_;
  // Tied gradients: sent to the peers this step, and the peers' sides that arrived, by tie.
  bool tied_sent_ = false;
  bool tied_summed_ = false;
  std::map<int, Tensor> peer_tied_;
  // With replicas: this stage's group and the step's gradient sum.
  std::optional<ReplicaGroup> group_;
  double sum_started_us_ = 0;
  bool sum_shared_ = false;
  std::vector<Tensor> sum_order_;
  std::map<size_t, size_t> ready_after_task_;  // task index -> parameters final after it
  size_t shared_count_ = 0;  // the leading parameters of sum_order_ gone to the sum
  std::map<const AutogradMeta*, size_t> sum_position_;  // a chunk parameter's place in it
  std::vector<bool> final_;                             // by place: its gradient is final
  bool updated_ = false;  // ZeRO-1: this stage's own update is done, the others' awaited
};

}  // namespace pipit
