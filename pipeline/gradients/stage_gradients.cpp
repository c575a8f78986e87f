#include "pipeline/gradients/stage_gradients.h"

#include <algorithm>
#include <set>

#include "autograd/grad_mode.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/schedules/task_runner.h"
#include "pipeline/stage.h"
#include "pipit.h"

namespace pipit {

StageGradients::StageGradients(Stage& stage) : stage_(stage) {
  const StageSpec& spec = stage.spec_;
  if (spec.replicas > 1) {
    group_.emplace(spec.stage, spec.stages, spec.replica, spec.replicas, stage.comm_.get());
  }
  const auto replica = [this](const Message& m) { return accepts_replica(m); };
  stage.on(PipelineKind::TiedGradient, {[this](const Message& m) { return accepts_tied(m); },
                                        [this](Message m) { return receive_tied(std::move(m)); }});
  stage.on(MessageKind::AllReduceSegment,
           {replica, [this](Message m) { return receive_segment(std::move(m)); }});
  stage.on(MessageKind::PairSumDone,
           {[this](const Message& m) { return group_ && m.from == stage_.me(); },
            [this](Message m) { return receive_pair_sum(std::move(m)); }});
  stage.on(PipelineKind::ParameterShard,
           {replica, [this](Message m) { return receive_parameters(std::move(m)); }});
  stage.on(PipelineKind::OptimizerStep,
           {nullptr, [this](Message m) { return apply_optimizer(std::move(m)); }});
  if (!group_) return;
  stage.tasks_->watch = [this](size_t task) -> std::function<void(const AutogradMeta&)> {
    // A chunk's last B or W on the CPU: its layers' gradients go to the sum as they are final.
    if (!stage_.spec_.device.is_cpu() || !ready_after_task_.count(task)) return nullptr;
    return [this](const AutogradMeta& leaf) { gradient_final(leaf); };
  };
  stage.tasks_->finished = [this](size_t task) {
    const auto ready = ready_after_task_.find(task);
    if (ready != ready_after_task_.end()) share(ready->second);
  };
}

bool StageGradients::training() const {
  return stage_.tasks_->active() && stage_.tasks_->training();
}

bool StageGradients::accepts_tied(const Message& message) const {
  // Only from the stage holding the tie's other side.
  const std::vector<TiedParameter>& ties = stage_.spec_.ties;
  if (message.microbatch < 0 || static_cast<size_t>(message.microbatch) >= ties.size()) {
    return false;
  }
  const TiedParameter& tie = ties[static_cast<size_t>(message.microbatch)];
  const int here = stage_.spec_.stage;
  const int peer = tie.source_stage == here ? tie.copy_stage : tie.source_stage;
  return peer != here && message.from == stage_.endpoint(peer);
}

bool StageGradients::accepts_replica(const Message& message) const {
  return member(message.from);
}

bool StageGradients::receive_tied(Message message) {
  PIPIT_CHECK(message.tensors.size() == 1, "TiedGradient message carries ", message.tensors.size(),
              " tensors, expected 1");
  if (message.step > stage_.step()) {
    stage_.keep_early(std::move(message));
    return true;
  }
  if (!stage_.tasks_->active() || message.step != stage_.step()) return true;
  peer_tied_[message.microbatch] = std::move(message.tensors[0]);
  stage_.advance();
  return true;
}

bool StageGradients::receive_segment(Message message) {
  // Another replica's share of this step's gradient sum: kept until this stage's own
  // gradients are ready when it comes first.
  if (message.step > stage_.step()) {
    stage_.keep_early(std::move(message));
  } else if (message.step == stage_.step() && training()) {
    for (auto& [to, out] : group_->receive(message)) stage_.send(to, std::move(out));
    finish_when_summed();
  }
  return true;
}

bool StageGradients::receive_pair_sum(Message message) {
  // A bucket summed by the communicator (MPI_Iallreduce): an aborted step's is dropped.
  if (message.step == stage_.step() && training()) {
    group_->pair_sum_done(message);
    finish_when_summed();
  }
  return true;
}

void StageGradients::begin_step() {
  for (Message& m : stage_.take_early(PipelineKind::TiedGradient)) {
    peer_tied_[m.microbatch] = std::move(m.tensors[0]);
  }
  if (!training() || !group_) return;
  plan_sum();
  for (const Message& m : stage_.take_early(MessageKind::AllReduceSegment)) {
    for (auto& [to, out] : group_->receive(m)) stage_.send(to, std::move(out));
    finish_when_summed();
  }
}

void StageGradients::plan_sum() {
  const StageSpec& spec = stage_.spec_;
  const std::vector<Task>& tasks = stage_.tasks_->tasks();
  std::set<std::string> tied;
  for (const TiedParameter& tie : spec.ties) {
    tied.insert(tie.source);
    tied.insert(tie.copy);
  }
  // (index of the chunk's last task that computes weight gradients, local chunk); a chunk
  // without one goes with the tied parameters, at the end.
  std::vector<std::pair<size_t, int>> last;
  for (int local = 0; local < spec.chunks_per_stage; ++local) {
    const int global = global_chunk(spec.stage, local, spec.stages, placement_of(spec.schedule));
    size_t at = tasks.size();
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Phase phase = tasks[i].phase;
      if (tasks[i].chunk == global && (phase == Phase::Backward || phase == Phase::WeightGrad)) {
        at = i;
      }
    }
    last.emplace_back(at, local);
  }
  std::sort(last.begin(), last.end());
  std::vector<Tensor> tied_parameters;
  for (const auto& [at, local] : last) {
    // Last layer first: the order in which the backward finishes them.
    const NamedParameters named = spec.chunks[static_cast<size_t>(local)]->named_parameters();
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      if (tied.count(it->first)) {
        tied_parameters.push_back(it->second);
        continue;
      }
      if (at < tasks.size()) sum_position_[it->second.impl().autograd.get()] = sum_order_.size();
      sum_order_.push_back(it->second);
    }
    if (at < tasks.size()) ready_after_task_[at] = sum_order_.size();
  }
  sum_order_.insert(sum_order_.end(), tied_parameters.begin(), tied_parameters.end());
  final_.assign(sum_order_.size(), false);
  for (auto& [to, message] : group_->begin(sum_order_, stage_.step())) {
    stage_.send(to, std::move(message));
  }
}

void StageGradients::share(size_t count) {
  if (!sum_shared_) {
    sum_started_us_ = trace_clock_us();
    sum_shared_ = true;
  }
  shared_count_ = std::max(shared_count_, count);
  for (auto& [to, message] : group_->ready(count)) stage_.send(to, std::move(message));
}

void StageGradients::gradient_final(const AutogradMeta& leaf) {
  const auto at = sum_position_.find(&leaf);
  if (at == sum_position_.end()) return;
  final_[at->second] = true;
  size_t count = shared_count_;
  while (count < final_.size() && final_[count]) ++count;
  if (count == shared_count_) return;
  share(count);
  // The segments other replicas sent meanwhile are summed now, not after the task.
  stage_.pump([this](const Message& message) {
    if (message.kind != MessageKind::AllReduceSegment || message.step != stage_.step()) {
      return false;
    }
    for (auto& [to, out] : group_->receive(message)) stage_.send(to, std::move(out));
    return true;
  });
}

void StageGradients::after_tasks() {
  // Once the tied sums are in, a message that runs us again only checks the replicas' sum.
  if (!stage_.tasks_->training() || stage_.spec_.ties.empty() || tied_summed_) {
    return reduce_over_replicas();
  }
  size_t remote = 0;
  const std::vector<TiedParameter>& ties = stage_.spec_.ties;
  for (size_t i = 0; i < ties.size(); ++i) {
    const TiedParameter& tie = ties[i];
    if (tie.source_stage == tie.copy_stage) continue;
    ++remote;
    if (tied_sent_) continue;
    const bool source = tie.source_stage == stage_.spec_.stage;
    const Tensor p = parameter(source ? tie.source : tie.copy);
    const Tensor grad = p.grad().defined() ? p.grad() : zeros_like(p);
    stage_.send(stage_.endpoint(source ? tie.copy_stage : tie.source_stage),
                Message{PipelineKind::TiedGradient, stage_.step(), static_cast<int>(i), 0, {grad}});
  }
  tied_sent_ = true;
  if (peer_tied_.size() < remote) return;  // the rest arrive as TiedGradient messages
  sum_tied_gradients();
  tied_summed_ = true;
  reduce_over_replicas();
}

void StageGradients::sum_tied_gradients() {
  NoGradGuard no_grad;
  const std::vector<TiedParameter>& ties = stage_.spec_.ties;
  for (size_t i = 0; i < ties.size(); ++i) {
    const TiedParameter& tie = ties[i];
    const bool has_source = tie.source_stage == stage_.spec_.stage;
    const bool has_copy = tie.copy_stage == stage_.spec_.stage;
    auto side = [&](bool here, const std::string& name) {
      if (!here) return stage_.on_device(peer_tied_.at(static_cast<int>(i)));
      const Tensor p = parameter(name);
      return p.grad().defined() ? p.grad() : zeros_like(p);
    };
    // Source's + copy's: the same two operands in the same order on both stages.
    const Tensor sum = side(has_source, tie.source) + side(has_copy, tie.copy);
    if (has_source) parameter(tie.source).set_grad(sum);
    if (has_copy) parameter(tie.copy).set_grad(has_source ? sum.clone() : sum);
  }
}

void StageGradients::reduce_over_replicas() {
  if (!stage_.tasks_->training() || !group_) return stage_.finish_step();
  if (!group_->all_ready()) share(sum_order_.size());
  if (group_->done()) stage_.finish_step();
}

void StageGradients::finish_when_summed() {
  // The sum may complete before the stage's last task (when its last weight gradients came
  // earlier): the step ends only after that task and the tied exchange.
  const bool tasks_done = stage_.tasks_->done() && (stage_.spec_.ties.empty() || tied_summed_);
  if (stage_.tasks_->active() && tasks_done && group_->done()) stage_.finish_step();
}

std::optional<TraceEvent> StageGradients::sum_event() const {
  if (!group_ || !group_->done()) return std::nullopt;
  return TraceEvent{{stage_.step(), 0, 0, Phase::GradientSum, stage_.spec_.stage},
                    sum_started_us_,
                    trace_clock_us()};
}

Tensor StageGradients::parameter(const std::string& name) const {
  for (const auto& c : stage_.spec_.chunks) {
    for (const auto& [n, p] : c->named_parameters()) {
      if (n == name) return p;
    }
  }
  throw Error(detail::concat(stage_.name(), " holds no parameter '", name, "'"));
}

NamedParameters StageGradients::owned(NamedParameters parameters,
                                      const std::vector<Tensor>& tensors) {
  if (!stage_.spec_.shard_optimizer) return parameters;
  // ZeRO-1: this replica's optimizer sees only the parameters it updates.
  const std::vector<int>& owners = group_->shard(tensors);
  NamedParameters mine;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (owners[i] == stage_.spec_.replica) mine.push_back(std::move(parameters[i]));
  }
  return mine;
}

bool StageGradients::apply_optimizer(Message message) {
  if (message.step != stage_.step()) return true;
  const OptimizerStep command = read_optimizer_step(message);
  if (command.skip) {
    // The coordinator found an inf or NaN gradient (f16 loss scaling): drop this step's update.
    stage_.zero_grad();
    stage_.send_to_coordinator(Message{PipelineKind::OptimizerDone, stage_.step()});
    return true;
  }
  if (command.grad_scale != 1.0) scale_gradients(stage_.parameters_, command.grad_scale);
  if (command.lr) stage_.optimizer_->set_lr(*command.lr);
  stage_.optimizer_->step();
  stage_.zero_grad();
  if (!stage_.spec_.shard_optimizer) {
    stage_.send_to_coordinator(Message{PipelineKind::OptimizerDone, stage_.step()});
    return true;
  }
  for (auto& [to, out] : group_->share_parameters(stage_.step())) stage_.send(to, std::move(out));
  updated_ = true;
  finish_update();
  return true;
}

bool StageGradients::receive_parameters(Message message) {
  // Another replica's updated parameters (ZeRO-1): they may come before this stage's own
  // OptimizerStep.
  if (message.step == stage_.step() && stage_.spec_.shard_optimizer) {
    for (auto& [to, out] : group_->receive_parameters(message)) stage_.send(to, std::move(out));
    finish_update();
  }
  return true;
}

void StageGradients::finish_update() {
  if (!updated_ || !group_->parameters_gathered()) return;
  updated_ = false;
  stage_.send_to_coordinator(Message{PipelineKind::OptimizerDone, stage_.step()});
}

void StageGradients::reset() {
  tied_sent_ = false;
  tied_summed_ = false;
  peer_tied_.clear();
  if (group_) group_->reset();
  sum_order_.clear();
  ready_after_task_.clear();
  sum_shared_ = false;
  shared_count_ = 0;
  sum_position_.clear();
  final_.clear();
  updated_ = false;
}

}  // namespace pipit
