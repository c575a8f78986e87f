#include "pipeline/schedules/task_runner.h"

#include <algorithm>

#include "autograd/accumulation_hook.h"
#include "autograd/grad_mode.h"
#include "pipeline/schedules/schedule.h"
#include "pipeline/stage.h"
#include "tensor/factory.h"

namespace pipit {

TaskRunner::TaskRunner(Stage& stage) : stage_(stage), timer_(stage.spec_.slowdown) {
  for (MessageKind kind : {PipelineKind::Activation, PipelineKind::Gradient}) {
    stage.on(kind, {[this](const Message& m) { return accepts(m); },
                    [this](Message m) { return receive(std::move(m)); }});
  }
}

bool TaskRunner::accepts(const Message& message) const {
  const int chunks = stage_.last_chunk() + 1;
  const int c = message.chunk;
  if (c < 0 || c >= chunks || stage_.endpoint_of(c) != stage_.me()) return false;
  // Into chunk c from the chunk before it (forward) or after it (backward), or from the
  // coordinator at either end.
  const bool forward = message.kind == PipelineKind::Activation;
  const bool from_coordinator = forward ? c == 0 : c == chunks - 1;
  return message.from ==
         (from_coordinator ? kCoordinator : stage_.endpoint_of(forward ? c - 1 : c + 1));
}

bool TaskRunner::receive(Message message) {
  PIPIT_CHECK(message.tensors.size() == 1, message_kind_name(message.kind), " message carries ",
              message.tensors.size(), " tensors, expected 1");
  // Over TCP a neighbour's data can overtake the coordinator's StepBegin: keep it until
  // then, at most one schedule's worth. Data from an aborted or finished step is dropped.
  if (message.step > stage_.step()) {
    stage_.keep_early(std::move(message));
    return true;
  }
  if (!active_ || message.step != stage_.step() || message.microbatch < 0 ||
      message.microbatch >= microbatches_) {
    return true;
  }
  store(std::move(message));
  stage_.advance();
  return true;
}

void TaskRunner::store(Message message) {
  const Phase phase = message.kind == PipelineKind::Activation ? Phase::Forward : Phase::Backward;
  inputs_[{phase, message.microbatch, message.chunk}] = std::move(message.tensors[0]);
}

void TaskRunner::begin(const StepBegin& begin) {
  const StageSpec& spec = stage_.spec_;
  active_ = true;
  training_ = begin.train;
  record_trace_ = begin.trace;
  microbatches_ = begin.microbatches;
  timer_.begin_step(begin.profile && training_);
  chunk_busy_us_.assign(static_cast<size_t>(spec.chunks_per_stage), 0.0);
  const int p = spec.stages, v = spec.chunks_per_stage;
  Schedule schedule = training_
                          ? make_schedule(spec.schedule, p, microbatches_, v, spec.schedule_table,
                                          spec.max_deferred)
                          : forward_only_schedule(p, microbatches_, v, placement_of(spec.schedule));
  tasks_ = std::move(schedule[static_cast<size_t>(spec.stage)]);
  for (Task& task : tasks_) task.step = stage_.step();
  for (MessageKind kind : {PipelineKind::Activation, PipelineKind::Gradient}) {
    for (Message& m : stage_.take_early(kind)) {
      if (m.microbatch >= 0 && m.microbatch < microbatches_) store(std::move(m));
    }
  }
  for (const auto& c : spec.chunks) c->train(training_);
}

const Task* TaskRunner::current() const {
  return active_ && next_task_ < tasks_.size() ? &tasks_[next_task_] : nullptr;
}

bool TaskRunner::run_ready() {
  while (active_ && next_task_ < tasks_.size()) {
    const Task& task = tasks_[next_task_];
    Tensor input;
    // W takes no input: its I, earlier on this stage, left it everything it needs.
    if (task.phase != Phase::WeightGrad) {
      // Gradients arrive as Backward inputs, whether a B or an I takes them.
      const Phase input_phase = task.phase == Phase::Forward ? Phase::Forward : Phase::Backward;
      auto found = inputs_.find({input_phase, task.microbatch, task.chunk});
      if (found == inputs_.end()) return false;
      input = std::move(found->second);
      inputs_.erase(found);
    }
    const double start = trace_clock_us();
    {
      std::optional<AccumulationHook> hook;
      if (watch) {
        if (auto on_final = watch(next_task_)) hook.emplace(std::move(on_final));
      }
      run(task, input);
    }
    record(task, start, trace_clock_us());
    if (finished) finished(next_task_);
    ++next_task_;
  }
  return active_;
}

void TaskRunner::run(const Task& task, const Tensor& input) {
  switch (task.phase) {
    case Phase::Forward:
      return forward(task, input);
    case Phase::Backward:
      return backward(task, input);
    case Phase::InputGrad:
      return input_grad(task, input);
    case Phase::WeightGrad:
      return weight_grad(task);
    case Phase::Recompute:
    case Phase::GradientSum:
      break;
  }
  throw Error(detail::concat("a schedule holds ", task, ", which only traces may"));
}

void TaskRunner::record(const Task& task, double start, double end) {
  chunk_busy_us_[static_cast<size_t>(stage_.local_chunk(task.chunk))] += end - start;
  if (record_trace_) {
    if (recomputed_) {
      Task recompute = task;
      recompute.phase = Phase::Recompute;
      trace_.add({recompute, recomputed_->first, recomputed_->second});
      start = recomputed_->second;
    }
    trace_.add({task, start, end});
  }
  recomputed_.reset();
}

void TaskRunner::forward(const Task& task, const Tensor& input) {
  Message out{PipelineKind::Activation, stage_.step(), task.microbatch, task.chunk + 1};
  const int to =
      task.chunk == stage_.last_chunk() ? kCoordinator : stage_.endpoint_of(task.chunk + 1);
  const Tensor local = stage_.on_device(input);
  Sequential& chunk = stage_.chunk(task.chunk);
  if (!training_) {
    NoGradGuard no_grad;
    out.tensors = {timer_.forward(chunk, local)};
    stage_.send(to, std::move(out));
    return;
  }
  if (is_half(stage_.spec_.compute_dtype) && !weights_rounded_) weights_rounded_.emplace();
  Stashed& stashed = stash_[{task.microbatch, task.chunk}];
  if (stage_.spec_.recompute) {
    // Only the input is kept, and where the chunk's random streams stood, to draw the same
    // dropout masks when the forward runs again.
    for (Generator* g : chunk.generators()) stashed.rng_offsets.push_back(g->offset());
    NoGradGuard no_grad;
    out.tensors = {timer_.forward(chunk, local)};
    stashed.leaf = local;
  } else {
    forward_with_grad(task, local, stashed);
    out.tensors = {stashed.output.detach()};
  }
  peak_stashed_ = std::max(peak_stashed_, stash_.size());
  stage_.send(to, std::move(out));
}

void TaskRunner::forward_with_grad(const Task& task, const Tensor& input, Stashed& stashed) {
  Sequential& chunk = stage_.chunk(task.chunk);
  // The received tensor starts this stage's own graph; its gradient is what goes upstream.
  stashed.leaf = input.detach();
  if (task.chunk > 0 && is_floating(stashed.leaf.dtype())) {
    stashed.leaf.requires_grad_();
    stashed.split_at = stashed.leaf;
    stashed.output = timer_.forward(chunk, stashed.leaf);
  } else {
    // Nobody needs the input's gradient, but a split backward's I still carries the gradient
    // down through the chunk, to the first layer's output; that layer's own weight gradients
    // (an embedding's) are W's, like every other weight gradient.
    stashed.output = timer_.forward(chunk, stashed.leaf, &stashed.split_at);
  }
}

TaskRunner::Stashed TaskRunner::take_stashed(const Task& task, const Tensor& grad) {
  auto it = stash_.find({task.microbatch, task.chunk});
  PIPIT_CHECK(it != stash_.end(), "no stashed forward for ", task);
  Stashed stashed = std::move(it->second);
  stash_.erase(it);
  if (stage_.spec_.recompute) recompute(task, stashed);
  PIPIT_CHECK(grad.shape() == stashed.output.shape(), "the gradient has shape ",
              shape_str(grad.shape()), " but the chunk's output has shape ",
              shape_str(stashed.output.shape()));
  return stashed;
}

void TaskRunner::recompute(const Task& task, Stashed& stashed) {
  const double start = trace_clock_us();
  const std::vector<Generator*> generators = stage_.chunk(task.chunk).generators();
  std::vector<uint64_t> now;
  for (size_t i = 0; i < generators.size(); ++i) {
    now.push_back(generators[i]->offset());
    generators[i]->set_state(generators[i]->seed(), stashed.rng_offsets.at(i));
  }
  forward_with_grad(task, Tensor(stashed.leaf), stashed);
  for (size_t i = 0; i < generators.size(); ++i) {
    generators[i]->set_state(generators[i]->seed(), now[i]);
  }
  recomputed_ = {start, trace_clock_us()};
}

void TaskRunner::send_input_grad(const Task& task, const Tensor& leaf) {
  if (task.chunk == 0) return;
  Tensor input_grad = leaf.grad();
  if (!input_grad.defined()) input_grad = zeros_like(leaf);
  Message out{PipelineKind::Gradient, stage_.step(), task.microbatch, task.chunk - 1, {input_grad}};
  stage_.send(stage_.endpoint_of(task.chunk - 1), std::move(out));
}

void TaskRunner::backward(const Task& task, const Tensor& grad) {
  const Stashed stashed = take_stashed(task, grad);
  if (stashed.output.requires_grad()) {
    timer_.backward(stage_.chunk(task.chunk), stashed.output, stage_.on_device(grad));
  }
  send_input_grad(task, stashed.leaf);
}

void TaskRunner::input_grad(const Task& task, const Tensor& grad) {
  const Stashed stashed = take_stashed(task, grad);
  DeferredGradients deferred;
  if (stashed.output.requires_grad()) {
    deferred = timer_.backward_inputs(stage_.chunk(task.chunk), stashed.output,
                                      stage_.on_device(grad), stashed.split_at);
  }
  // The chunk's graph goes with the stash entry; W keeps only what it needs.
  deferred_[{task.microbatch, task.chunk}] = std::move(deferred);
  peak_deferred_ = std::max(peak_deferred_, deferred_.size());
  send_input_grad(task, stashed.leaf);
}

void TaskRunner::weight_grad(const Task& task) {
  auto deferred = deferred_.find({task.microbatch, task.chunk});
  PIPIT_CHECK(deferred != deferred_.end(), "no input gradient (I) ran before ", task);
  timer_.weight_gradients(stage_.chunk(task.chunk), deferred->second);
  deferred_.erase(deferred);
}

void TaskRunner::report(StageDone& done) const {
  done.peak_stashed = static_cast<int64_t>(peak_stashed_);
  done.peak_deferred = static_cast<int64_t>(peak_deferred_);
  if (record_trace_) {
    for (const TraceEvent& e : trace_.events()) {
      done.trace.push_back(
          {e.task.microbatch, e.task.chunk, static_cast<int>(e.task.phase), e.start_us, e.end_us});
    }
  }
  done.chunk_busy_us = chunk_busy_us_;
  if (timer_.profiling()) done.layers = layer_timings();
}

std::vector<LayerTiming> TaskRunner::layer_timings() const {
  const StateDict optimizer_state = stage_.optimizer_->state_dict();
  std::vector<LayerTiming> timings;
  for (const auto& c : stage_.spec_.chunks) {
    for (size_t i = 0; i < c->size(); ++i) {
      const auto layer = static_cast<int64_t>(c->first_index() + i);
      const auto found = timer_.layers().find(layer);
      LayerTiming timing = found != timer_.layers().end() ? found->second : LayerTiming{layer};
      const std::string prefix = std::to_string(layer) + ".";
      for (const Tensor& p : (*c)[i]->parameters()) {
        timing.state_bytes += static_cast<double>(p.nbytes());
      }
      for (const auto& [name, value] : optimizer_state) {
        if (name.compare(0, prefix.size(), prefix) == 0) {
          timing.state_bytes += static_cast<double>(value.nbytes());
        }
      }
      timings.push_back(timing);
    }
  }
  return timings;
}

void TaskRunner::end_step() {
  weights_rounded_.reset();
  active_ = false;
  if (!training_) {
    for (const auto& c : stage_.spec_.chunks) c->train(true);
  }
}

void TaskRunner::reset() {
  weights_rounded_.reset();
  active_ = false;
  tasks_.clear();
  next_task_ = 0;
  inputs_.clear();
  stash_.clear();
  recomputed_.reset();
  deferred_.clear();
  peak_stashed_ = 0;
  peak_deferred_ = 0;
  trace_.clear();
}

}  // namespace pipit
