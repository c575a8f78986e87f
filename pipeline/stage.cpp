#include "pipeline/stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <sstream>

#include "autograd/accumulation_hook.h"
#include "autograd/grad_mode.h"
#include "pipeline/protocol/generate_messages.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/schedules/schedule.h"
#include "pipit.h"

namespace pipit {

Stage::Stage(StageSpec spec, std::shared_ptr<Communicator> communicator)
    : spec_(std::move(spec)),
      comm_(std::move(communicator)),
      stream_(spec_.device.is_cuda() ? Stream::create(spec_.device)
                                     : Stream::default_stream(spec_.device)),
      timer_(spec_.slowdown) {
  PIPIT_CHECK(spec_.stage >= 0 && spec_.stage < spec_.stages, "Stage: stage index ", spec_.stage,
              " is outside [0, ", spec_.stages, ")");
  PIPIT_CHECK(static_cast<int>(spec_.chunks.size()) == spec_.chunks_per_stage, "Stage ",
              spec_.stage, ": expected ", spec_.chunks_per_stage, " chunks, got ",
              spec_.chunks.size());
  for (const auto& c : spec_.chunks) {
    PIPIT_CHECK(c != nullptr, "Stage ", spec_.stage, ": a chunk is null");
    c->to(spec_.device);
  }
  PIPIT_CHECK(spec_.replicas >= 1 && spec_.replica >= 0 && spec_.replica < spec_.replicas, "Stage ",
              spec_.stage, ": replica ", spec_.replica, " is outside [0, ", spec_.replicas, ")");
  if (spec_.replicas == 1) spec_.shard_optimizer = false;  // one replica owns everything
  if (spec_.replicas > 1) {
    replica_group_.emplace(spec_.stage, spec_.stages, spec_.replica, spec_.replicas, comm_.get());
  }
  adopt(std::move(spec_.chunks), spec_.optimizer, spec_.optimizer_state);
  spec_.optimizer_state.clear();
}

void Stage::adopt(std::vector<std::shared_ptr<Sequential>> chunks, const nlohmann::json& optimizer,
                  const StateDict& optimizer_state) {
  NamedParameters parameters;
  std::vector<Tensor> tensors, counted;
  std::set<std::string> copies;
  for (const TiedParameter& tie : spec_.ties) copies.insert(tie.copy);
  for (const auto& c : chunks) {
    for (auto& named : c->named_parameters()) {
      tensors.push_back(named.second);
      if (!copies.count(named.first)) counted.push_back(named.second);
      parameters.push_back(std::move(named));
    }
  }
  if (spec_.shard_optimizer) {
    // ZeRO-1: this replica's optimizer sees only the parameters it updates.
    const std::vector<int>& owners = replica_group_->shard(tensors);
    NamedParameters owned;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (owners[i] == spec_.replica) owned.push_back(std::move(parameters[i]));
    }
    parameters = std::move(owned);
  }
  auto made = make_optimizer(optimizer, std::move(parameters));
  if (!optimizer_state.empty()) {
    made->load_state_dict(
        optimizer_state_for(with_tied_copies(optimizer_state, spec_.ties), made->parameters()));
  }
  spec_.chunks = std::move(chunks);
  parameters_ = std::move(tensors);
  norm_parameters_ = std::move(counted);
  optimizer_ = std::move(made);
}

Sequential& Stage::chunk(int global_chunk) {
  const int local = local_chunk(global_chunk, spec_.stages, placement_of(spec_.schedule));
  return *spec_.chunks[static_cast<size_t>(local)];
}

int Stage::endpoint_of(int chunk) const {
  return endpoint(stage_of_chunk(chunk, spec_.stages, placement_of(spec_.schedule)));
}

void Stage::run() {
  // The stage's thread queues its GPU work on a stream of its own, so stages sharing a GPU
  // overlap, and computes in the stage's autocast dtype.
  StreamGuard stream(stream_);
  AutocastGuard autocast(spec_.compute_dtype);
  try {
    while (handle(next_message())) {
    }
  } catch (const ClosedError&) {
  } catch (const std::exception& e) {
    // Not a task's failure (handle() reports those and goes on) but the loop's own: the
    // stage stops, and says so rather than ending its thread silently.
    report_error(name() + " stopped: " + e.what());
  } catch (...) {
    report_error(name() + " stopped on an unknown exception");
  }
  weights_rounded_.reset();
}

Message Stage::next_message() {
  if (interrupted_.empty()) return comm_->receive();
  Message message = std::move(interrupted_.front());
  interrupted_.pop_front();
  return message;
}

void Stage::report_error(const std::string& message) {
  try {
    comm_->send(kCoordinator, to_message(StageError{message, spec_.stage}, step_));
  } catch (...) {
    // The communicator itself failed: the coordinator's deadline reports this stage.
  }
}

Tensor Stage::on_device(const Tensor& received) {
  Tensor local = received.to(spec_.device);
  // Another stage's stream allocated it, and that stage may drop it last.
  if (local.same_storage(received)) record_stream(local, stream_);
  return local;
}

void Stage::send(int to, Message message) {
  if (spec_.device.is_cuda()) {
    if (comm_->carries_device_tensors()) {
      // The receiver queues on another stream: our work on these tensors must be done.
      stream_.synchronize();
    } else {
      for (Tensor& t : message.tensors) t = t.to(Device::cpu());
    }
  }
  if (to == me() &&
      (message.kind == PipelineKind::Activation || message.kind == PipelineKind::Gradient)) {
    // The next chunk is this stage's own (the turn of a V): it is an input at once.
    const Phase phase = message.kind == PipelineKind::Activation ? Phase::Forward : Phase::Backward;
    inputs_[{phase, message.microbatch, message.chunk}] = std::move(message.tensors[0]);
    return;
  }
  comm_->send(to, std::move(message));
}

bool Stage::handle(Message message) {
  std::ostringstream what;
  try {
    return dispatch(std::move(message));
  } catch (const std::exception& e) {
    what << name() << " failed";
    if (active_ && next_task_ < tasks_.size()) what << " in task " << tasks_[next_task_];
    what << " of step " << step_ << ": " << e.what();
  } catch (...) {
    what << name() << " failed in step " << step_ << " on an unknown exception";
  }
  reset();
  report_error(what.str());
  return true;
}

bool Stage::accepts(const Message& message) const {
  if (is_coordinator_command(message.kind)) return message.from == kCoordinator;
  const int chunks = spec_.stages * spec_.chunks_per_stage;
  const int c = message.chunk;
  if (message.kind == PipelineKind::Activation || message.kind == PipelineKind::Gradient) {
    if (c < 0 || c >= chunks || endpoint_of(c) != me()) return false;
    const bool forward = message.kind == PipelineKind::Activation;
    const bool from_coordinator = forward ? c == 0 : c == chunks - 1;
    return message.from == (from_coordinator ? kCoordinator : endpoint_of(forward ? c - 1 : c + 1));
  }
  if (message.kind == PipelineKind::GenerateStep) {
    // Like an activation: into chunk c from the coordinator (c = 0) or chunk c - 1's stage.
    if (c < 0 || c >= chunks || endpoint_of(c) != me()) return false;
    return message.from == (c == 0 ? kCoordinator : endpoint_of(c - 1));
  }
  if (message.kind == PipelineKind::TiedGradient) {
    // Only from the stage holding the tie's other side.
    if (message.microbatch < 0 || static_cast<size_t>(message.microbatch) >= spec_.ties.size()) {
      return false;
    }
    const TiedParameter& tie = spec_.ties[static_cast<size_t>(message.microbatch)];
    const int peer = tie.source_stage == spec_.stage ? tie.copy_stage : tie.source_stage;
    return peer != spec_.stage && message.from == endpoint(peer);
  }
  if (message.kind == MessageKind::PairSumDone) {
    return replica_group_ && message.from == me();
  }
  if (message.kind == MessageKind::AllReduceSegment ||
      message.kind == PipelineKind::ParameterShard || message.kind == MessageKind::State) {
    return replica_group_ && replica_group_->member(message.from);
  }
  if (message.kind == PipelineKind::LayerTransfer) {
    // Layers come only from the stage of a neighbouring chunk (LayerMigration checks which).
    if (c < 0 || c >= chunks || endpoint_of(c) != me()) return false;
    return (c > 0 && message.from == endpoint_of(c - 1)) ||
           (c + 1 < chunks && message.from == endpoint_of(c + 1));
  }
  return true;
}

bool Stage::dispatch(Message message) {
  // Commands only from the coordinator, data only from the stage that produces it: anything
  // else (a confused or hostile peer of the same run) is dropped.
  if (!accepts(message)) return true;
  const MessageKind kind = message.kind;
  if (kind == MessageKind::Shutdown) {
    return false;
  } else if (kind == PipelineKind::StepBegin) {
    begin_step(message);
  } else if (kind == PipelineKind::Abort) {
    if (message.step == step_) reset();
    return true;
  } else if (kind == PipelineKind::RemapPrepare) {
    prepare_remap(message);
    return true;
  } else if (kind == PipelineKind::LayerTransfer) {
    // Early also while this stage's replicas pool their optimizer state (ZeRO-1).
    if (message.step > step_ || (message.step == step_ && remap_prepare_)) {
      keep_early(std::move(message));
    } else if (migration_ && message.step == step_) {
      migration_->receive(message);
      advance_remap();
    }
    return true;
  } else if (kind == MessageKind::State) {
    // A replica's share of the optimizer state, for a remap under ZeRO-1.
    if (message.step > step_) {
      keep_early(std::move(message));
    } else if (message.step == step_ && shares_awaited_ > 0) {
      pool_optimizer_state(message);
    }
    return true;
  } else if (kind == PipelineKind::RemapCommit) {
    if (message.step == step_) commit_remap();
    return true;
  } else if (kind == PipelineKind::Activation || kind == PipelineKind::Gradient) {
    PIPIT_CHECK(message.tensors.size() == 1, message_kind_name(message.kind), " message carries ",
                message.tensors.size(), " tensors, expected 1");
    // Over TCP a neighbour's data can overtake the coordinator's StepBegin: keep it until
    // then, at most one schedule's worth. Data from an aborted or finished step is dropped.
    if (message.step > step_) {
      keep_early(std::move(message));
      return true;
    }
    if (!active_ || message.step != step_ || message.microbatch < 0 ||
        message.microbatch >= microbatches_) {
      return true;
    }
    const Phase phase = message.kind == PipelineKind::Activation ? Phase::Forward : Phase::Backward;
    inputs_[{phase, message.microbatch, message.chunk}] = std::move(message.tensors[0]);
  } else if (kind == PipelineKind::TiedGradient) {
    PIPIT_CHECK(message.tensors.size() == 1, "TiedGradient message carries ",
                message.tensors.size(), " tensors, expected 1");
    if (message.step > step_) {
      keep_early(std::move(message));
      return true;
    }
    if (!active_ || message.step != step_) return true;
    peer_tied_[message.microbatch] = std::move(message.tensors[0]);
  } else if (kind == MessageKind::AllReduceSegment) {
    // Another replica's share of this step's gradient sum: kept until this stage's own
    // gradients are ready when it comes first.
    if (message.step > step_) {
      keep_early(std::move(message));
    } else if (message.step == step_ && active_ && training_) {
      receive_replica_segment(message);
    }
    return true;
  } else if (kind == MessageKind::PairSumDone) {
    // A bucket summed by the communicator (MPI_Iallreduce): an aborted step's is dropped.
    if (message.step == step_ && active_ && training_) {
      replica_group_->pair_sum_done(message);
      finish_step_when_summed();
    }
    return true;
  } else if (kind == PipelineKind::OptimizerStep) {
    if (message.step == step_) apply_optimizer(message);
    return true;
  } else if (kind == PipelineKind::ParameterShard) {
    // Another replica's updated parameters (ZeRO-1): they may come before this stage's own
    // OptimizerStep.
    if (message.step == step_ && spec_.shard_optimizer) {
      for (auto& [to, out] : replica_group_->receive_parameters(message)) send(to, std::move(out));
      finish_update();
    }
    return true;
  } else if (kind == PipelineKind::GenerateBegin) {
    begin_generation(message);
    return true;
  } else if (kind == PipelineKind::GenerateStep) {
    // Over TCP a neighbour's step can overtake the coordinator's GenerateBegin.
    if (message.step > step_) {
      keep_early(std::move(message));
    } else if (message.step == step_ && !generation_.empty()) {
      generation_step(message);
    }
    return true;
  } else if (kind == PipelineKind::GenerateEnd) {
    if (message.step == step_) reset();
    comm_->send(kCoordinator, Message(PipelineKind::GenerateEnd, message.step));
    return true;
  } else if (kind == PipelineKind::FetchState) {
    send_state(message.step);
    return true;
  } else if (kind == MessageKind::PeerLost) {
    const PeerLost lost = read_peer_lost(message);
    if (lost.peer == kCoordinator) return false;  // the run is over
    // A neighbour is gone: this step cannot finish, and the coordinator should know why.
    reset();
    report_error(name() + " lost its connection to " +
                 endpoint_name(lost.peer, spec_.stages, spec_.replicas) + " at " + lost.address +
                 ": " + lost.reason);
    return true;
  } else {
    return true;
  }
  run_ready_tasks();
  return true;
}

void Stage::keep_early(Message message) {
  if (early_.size() >= kMaxEarlyMessages) {
    early_.clear();
    throw Error(
        detail::concat("more than ", kMaxEarlyMessages, " messages arrived ahead of their step"));
  }
  early_.push_back(std::move(message));
}

std::vector<Message> Stage::take_early(MessageKind kind) {
  std::vector<Message> now, later;
  for (Message& m : early_) {
    // Another kind of this step stays for its own take; earlier steps' messages go.
    if (m.step > step_ || (m.step == step_ && m.kind != kind)) {
      later.push_back(std::move(m));
    } else if (m.step == step_) {
      now.push_back(std::move(m));
    }
  }
  early_ = std::move(later);
  return now;
}

void Stage::begin_step(const Message& message) {
  const StepBegin begin = read_step_begin(message);
  reset();
  step_ = message.step;
  active_ = true;
  training_ = begin.train;
  record_trace_ = begin.trace;
  report_grad_norm_ = begin.grad_norm;
  microbatches_ = begin.microbatches;
  timer_.begin_step(begin.profile && training_);
  chunk_busy_us_.assign(static_cast<size_t>(spec_.chunks_per_stage), 0.0);
  const int p = spec_.stages, v = spec_.chunks_per_stage;
  Schedule schedule =
      training_ ? make_schedule(spec_.schedule, p, microbatches_, v, spec_.schedule_table,
                                spec_.max_deferred)
                : forward_only_schedule(p, microbatches_, v, placement_of(spec_.schedule));
  tasks_ = std::move(schedule[static_cast<size_t>(spec_.stage)]);
  for (Task& task : tasks_) task.step = step_;
  for (Message& m : take_early(PipelineKind::TiedGradient)) {
    peer_tied_[m.microbatch] = std::move(m.tensors[0]);
  }
  if (training_ && replica_group_) {
    plan_gradient_sum();
    for (const Message& m : take_early(MessageKind::AllReduceSegment)) receive_replica_segment(m);
  }
  for (MessageKind kind : {PipelineKind::Activation, PipelineKind::Gradient}) {
    for (Message& m : take_early(kind)) {
      if (m.microbatch < 0 || m.microbatch >= microbatches_) continue;
      const Phase phase = kind == PipelineKind::Activation ? Phase::Forward : Phase::Backward;
      inputs_[{phase, m.microbatch, m.chunk}] = std::move(m.tensors[0]);
    }
  }
  for (const auto& c : spec_.chunks) c->train(training_);
}

void Stage::run_ready_tasks() {
  while (active_ && next_task_ < tasks_.size()) {
    const Task& task = tasks_[next_task_];
    Tensor tensor;
    // W takes no input: its I, earlier on this stage, left it everything it needs.
    if (task.phase != Phase::WeightGrad) {
      // Gradients arrive as Backward inputs, whether a B or an I takes them.
      const Phase input_phase = task.phase == Phase::Forward ? Phase::Forward : Phase::Backward;
      auto input = inputs_.find({input_phase, task.microbatch, task.chunk});
      if (input == inputs_.end()) return;
      tensor = std::move(input->second);
      inputs_.erase(input);
    }
    const double start = trace_clock_us();
    // A chunk's last B or W on the CPU: its layers' gradients go to the sum as they are final.
    std::optional<AccumulationHook> layer_buckets;
    if (training_ && replica_group_ && spec_.device.is_cpu() &&
        ready_after_task_.count(next_task_)) {
      layer_buckets.emplace([this](const AutogradMeta& leaf) { gradient_final(leaf); });
    }
    switch (task.phase) {
      case Phase::Forward:
        forward(task, tensor);
        break;
      case Phase::Backward:
        backward(task, tensor);
        break;
      case Phase::InputGrad:
        input_grad(task, tensor);
        break;
      case Phase::WeightGrad:
        weight_grad(task);
        break;
      case Phase::Recompute:
      case Phase::GradientSum:
        throw Error(detail::concat("a schedule holds ", task, ", which only traces may"));
    }
    const double end = trace_clock_us();
    const int local = local_chunk(task.chunk, spec_.stages, placement_of(spec_.schedule));
    chunk_busy_us_[static_cast<size_t>(local)] += end - start;
    if (record_trace_) {
      double task_start = start;
      if (recomputed_) {
        Task recompute = task;
        recompute.phase = Phase::Recompute;
        trace_.add({recompute, recomputed_->first, recomputed_->second});
        task_start = recomputed_->second;
      }
      trace_.add({task, task_start, end});
    }
    recomputed_.reset();
    if (training_ && replica_group_) {
      const auto ready = ready_after_task_.find(next_task_);
      if (ready != ready_after_task_.end()) share_gradients(ready->second);
    }
    ++next_task_;
  }
  if (active_ && next_task_ == tasks_.size()) exchange_tied_gradients();
}

void Stage::exchange_tied_gradients() {
  // Once the tied sums are in, a message that runs us again only checks the replicas' sum.
  if (!training_ || spec_.ties.empty() || tied_summed_) return reduce_over_replicas();
  size_t remote = 0;
  for (size_t i = 0; i < spec_.ties.size(); ++i) {
    const TiedParameter& tie = spec_.ties[i];
    if (tie.source_stage == tie.copy_stage) continue;
    ++remote;
    if (tied_sent_) continue;
    const bool source = tie.source_stage == spec_.stage;
    const Tensor p = parameter(source ? tie.source : tie.copy);
    const Tensor grad = p.grad().defined() ? p.grad() : zeros_like(p);
    send(endpoint(source ? tie.copy_stage : tie.source_stage),
         Message{PipelineKind::TiedGradient, step_, static_cast<int>(i), 0, {grad}});
  }
  tied_sent_ = true;
  if (peer_tied_.size() < remote) return;  // the rest arrive as TiedGradient messages
  sum_tied_gradients();
  tied_summed_ = true;
  reduce_over_replicas();
}

void Stage::reduce_over_replicas() {
  if (!training_ || !replica_group_) return finish_step();
  if (!replica_group_->all_ready()) share_gradients(sum_order_.size());
  if (replica_group_->done()) finish_step();
}

void Stage::plan_gradient_sum() {
  std::set<std::string> tied;
  for (const TiedParameter& tie : spec_.ties) {
    tied.insert(tie.source);
    tied.insert(tie.copy);
  }
  // (index of the chunk's last task that computes weight gradients, local chunk); a chunk
  // without one goes with the tied parameters, at the end.
  std::vector<std::pair<size_t, int>> last;
  for (int local = 0; local < spec_.chunks_per_stage; ++local) {
    const int global = global_chunk(spec_.stage, local, spec_.stages, placement_of(spec_.schedule));
    size_t at = tasks_.size();
    for (size_t i = 0; i < tasks_.size(); ++i) {
      const Phase phase = tasks_[i].phase;
      if (tasks_[i].chunk == global && (phase == Phase::Backward || phase == Phase::WeightGrad)) {
        at = i;
      }
    }
    last.emplace_back(at, local);
  }
  std::sort(last.begin(), last.end());
  sum_order_.clear();
  ready_after_task_.clear();
  sum_position_.clear();
  std::vector<Tensor> tied_parameters;
  for (const auto& [at, local] : last) {
    // Last layer first: the order in which the backward finishes them.
    const NamedParameters named = spec_.chunks[static_cast<size_t>(local)]->named_parameters();
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      if (tied.count(it->first)) {
        tied_parameters.push_back(it->second);
        continue;
      }
      if (at < tasks_.size()) sum_position_[it->second.impl().autograd.get()] = sum_order_.size();
      sum_order_.push_back(it->second);
    }
    if (at < tasks_.size()) ready_after_task_[at] = sum_order_.size();
  }
  sum_order_.insert(sum_order_.end(), tied_parameters.begin(), tied_parameters.end());
  final_.assign(sum_order_.size(), false);
  shared_count_ = 0;
  for (auto& [to, message] : replica_group_->begin(sum_order_, step_)) {
    send(to, std::move(message));
  }
}

void Stage::share_gradients(size_t count) {
  if (!sum_shared_) {
    sum_started_us_ = trace_clock_us();
    sum_shared_ = true;
  }
  shared_count_ = std::max(shared_count_, count);
  for (auto& [to, message] : replica_group_->ready(count)) send(to, std::move(message));
}

void Stage::gradient_final(const AutogradMeta& leaf) {
  const auto at = sum_position_.find(&leaf);
  if (at == sum_position_.end()) return;
  final_[at->second] = true;
  size_t count = shared_count_;
  while (count < final_.size() && final_[count]) ++count;
  if (count == shared_count_) return;
  share_gradients(count);
  pump_replica_segments();
}

void Stage::pump_replica_segments() {
  // Bounded like early_: beyond that, messages wait in the communicator until the task ends.
  while (interrupted_.size() < kMaxEarlyMessages) {
    std::optional<Message> message = comm_->try_receive(std::chrono::milliseconds(0));
    if (!message) return;
    if (message->kind == MessageKind::AllReduceSegment && message->step == step_ &&
        accepts(*message)) {
      for (auto& [to, out] : replica_group_->receive(*message)) send(to, std::move(out));
    } else {
      interrupted_.push_back(std::move(*message));
    }
  }
}

void Stage::receive_replica_segment(const Message& message) {
  for (auto& [to, out] : replica_group_->receive(message)) send(to, std::move(out));
  finish_step_when_summed();
}

void Stage::finish_step_when_summed() {
  // The sum may complete before the stage's last task (when its last weight gradients came
  // earlier): the step ends only after that task and the tied exchange.
  const bool tasks_done = next_task_ == tasks_.size() && (spec_.ties.empty() || tied_summed_);
  if (active_ && tasks_done && replica_group_->done()) finish_step();
}

void Stage::sum_tied_gradients() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < spec_.ties.size(); ++i) {
    const TiedParameter& tie = spec_.ties[i];
    const bool has_source = tie.source_stage == spec_.stage;
    const bool has_copy = tie.copy_stage == spec_.stage;
    auto side = [&](bool here, const std::string& name) {
      if (!here) return on_device(peer_tied_.at(static_cast<int>(i)));
      const Tensor p = parameter(name);
      return p.grad().defined() ? p.grad() : zeros_like(p);
    };
    // Source's + copy's: the same two operands in the same order on both stages.
    const Tensor sum = side(has_source, tie.source) + side(has_copy, tie.copy);
    if (has_source) parameter(tie.source).set_grad(sum);
    if (has_copy) parameter(tie.copy).set_grad(has_source ? sum.clone() : sum);
  }
}

Tensor Stage::parameter(const std::string& name) const {
  for (const auto& c : spec_.chunks) {
    for (const auto& [n, p] : c->named_parameters()) {
      if (n == name) return p;
    }
  }
  throw Error(detail::concat(this->name(), " holds no parameter '", name, "'"));
}

void Stage::forward(const Task& task, const Tensor& input) {
  Message out{PipelineKind::Activation, step_, task.microbatch, task.chunk + 1};
  const int to = task.chunk == last_chunk() ? kCoordinator : endpoint_of(task.chunk + 1);
  const Tensor local = on_device(input);
  if (!training_) {
    NoGradGuard no_grad;
    out.tensors = {timer_.forward(chunk(task.chunk), local)};
    send(to, std::move(out));
    return;
  }
  if (is_half(spec_.compute_dtype) && !weights_rounded_) weights_rounded_.emplace();
  Stashed& stashed = stash_[{task.microbatch, task.chunk}];
  if (spec_.recompute) {
    // Only the input is kept, and where the chunk's random streams stood, to draw the same
    // dropout masks when the forward runs again.
    for (Generator* g : chunk(task.chunk).generators()) stashed.rng_offsets.push_back(g->offset());
    NoGradGuard no_grad;
    out.tensors = {timer_.forward(chunk(task.chunk), local)};
    stashed.leaf = local;
  } else {
    forward_with_grad(task, local, stashed);
    out.tensors = {stashed.output.detach()};
  }
  peak_stashed_ = std::max(peak_stashed_, stash_.size());
  send(to, std::move(out));
}

void Stage::forward_with_grad(const Task& task, const Tensor& input, Stashed& stashed) {
  // The received tensor starts this stage's own graph; its gradient is what goes upstream.
  stashed.leaf = input.detach();
  if (task.chunk > 0 && is_floating(stashed.leaf.dtype())) {
    stashed.leaf.requires_grad_();
    stashed.split_at = stashed.leaf;
    stashed.output = timer_.forward(chunk(task.chunk), stashed.leaf);
  } else {
    // Nobody needs the input's gradient, but a split backward's I still carries the gradient
    // down through the chunk, to the first layer's output; that layer's own weight gradients
    // (an embedding's) are W's, like every other weight gradient.
    stashed.output = timer_.forward(chunk(task.chunk), stashed.leaf, &stashed.split_at);
  }
}

Stage::Stashed Stage::take_stashed(const Task& task, const Tensor& grad) {
  auto it = stash_.find({task.microbatch, task.chunk});
  PIPIT_CHECK(it != stash_.end(), "no stashed forward for ", task);
  Stashed stashed = std::move(it->second);
  stash_.erase(it);
  if (spec_.recompute) {
    const double start = trace_clock_us();
    const std::vector<Generator*> generators = chunk(task.chunk).generators();
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
  PIPIT_CHECK(grad.shape() == stashed.output.shape(), "the gradient has shape ",
              shape_str(grad.shape()), " but the chunk's output has shape ",
              shape_str(stashed.output.shape()));
  return stashed;
}

void Stage::send_input_grad(const Task& task, const Tensor& leaf) {
  if (task.chunk == 0) return;
  Tensor input_grad = leaf.grad();
  if (!input_grad.defined()) input_grad = zeros_like(leaf);
  Message out{PipelineKind::Gradient, step_, task.microbatch, task.chunk - 1, {input_grad}};
  send(endpoint_of(task.chunk - 1), std::move(out));
}

void Stage::backward(const Task& task, const Tensor& grad) {
  const Stashed stashed = take_stashed(task, grad);
  if (stashed.output.requires_grad()) {
    timer_.backward(chunk(task.chunk), stashed.output, on_device(grad));
  }
  send_input_grad(task, stashed.leaf);
}

void Stage::input_grad(const Task& task, const Tensor& grad) {
  const Stashed stashed = take_stashed(task, grad);
  DeferredGradients deferred;
  if (stashed.output.requires_grad()) {
    deferred = timer_.backward_inputs(chunk(task.chunk), stashed.output, on_device(grad),
                                      stashed.split_at);
  }
  // The chunk's graph goes with the stash entry; W keeps only what it needs.
  deferred_[{task.microbatch, task.chunk}] = std::move(deferred);
  peak_deferred_ = std::max(peak_deferred_, deferred_.size());
  send_input_grad(task, stashed.leaf);
}

void Stage::weight_grad(const Task& task) {
  auto deferred = deferred_.find({task.microbatch, task.chunk});
  PIPIT_CHECK(deferred != deferred_.end(), "no input gradient (I) ran before ", task);
  timer_.weight_gradients(chunk(task.chunk), deferred->second);
  deferred_.erase(deferred);
}

void Stage::finish_step() {
  weights_rounded_.reset();
  if (record_trace_ && replica_group_ && replica_group_->done()) {
    trace_.add({{step_, 0, 0, Phase::GradientSum, spec_.stage}, sum_started_us_, trace_clock_us()});
  }
  StageDone done;
  done.peak_stashed = static_cast<int64_t>(peak_stashed_);
  done.peak_deferred = static_cast<int64_t>(peak_deferred_);
  if (report_grad_norm_) done.grad_norm_sq = grad_norm_squared(norm_parameters_);
  if (record_trace_) {
    for (const TraceEvent& e : trace_.events()) {
      done.trace.push_back(
          {e.task.microbatch, e.task.chunk, static_cast<int>(e.task.phase), e.start_us, e.end_us});
    }
  }
  done.chunk_busy_us = chunk_busy_us_;
  if (timer_.profiling()) done.layers = layer_timings();
  active_ = false;
  if (!training_) {
    for (const auto& c : spec_.chunks) c->train(true);
  }
  comm_->send(kCoordinator, to_message(done, step_));
}

void Stage::apply_optimizer(const Message& message) {
  const OptimizerStep command = read_optimizer_step(message);
  if (command.skip) {
    // The coordinator found an inf or NaN gradient (f16 loss scaling): drop this step's update.
    zero_grad();
    comm_->send(kCoordinator, Message{PipelineKind::OptimizerDone, step_});
    return;
  }
  if (command.grad_scale != 1.0) scale_gradients(parameters_, command.grad_scale);
  if (command.lr) optimizer_->set_lr(*command.lr);
  optimizer_->step();
  zero_grad();
  if (!spec_.shard_optimizer) {
    comm_->send(kCoordinator, Message{PipelineKind::OptimizerDone, step_});
    return;
  }
  for (auto& [to, out] : replica_group_->share_parameters(step_)) send(to, std::move(out));
  updated_ = true;
  finish_update();
}

void Stage::finish_update() {
  if (!updated_ || !replica_group_->parameters_gathered()) return;
  updated_ = false;
  comm_->send(kCoordinator, Message{PipelineKind::OptimizerDone, step_});
}

void Stage::zero_grad() {
  for (Tensor& p : parameters_) p.zero_grad();
}

void Stage::begin_generation(const Message& message) {
  const GenerateBegin begin = read_generate_begin(message);
  reset();
  step_ = message.step;
  for (const auto& c : spec_.chunks) {
    c->eval();
    generation_.push_back(
        std::make_unique<CachedLayers>(*c, begin.batch, begin.capacity, begin.padding));
  }
  for (const Message& early : take_early(PipelineKind::GenerateStep)) generation_step(early);
}

void Stage::generation_step(const Message& message) {
  PIPIT_CHECK(message.tensors.size() == 1, "GenerateStep message carries ", message.tensors.size(),
              " tensors, expected 1");
  const int64_t start = read_generate_start(message);
  NoGradGuard no_grad;
  Tensor x = on_device(message.tensors[0]);
  // Through this stage's chunks while the next one is here too (a V's turn), then onwards.
  for (int c = message.chunk;; ++c) {
    const int local = local_chunk(c, spec_.stages, placement_of(spec_.schedule));
    x = generation_[static_cast<size_t>(local)]->forward(x, start);
    if (c == last_chunk()) {
      x = last_logits(x, x.shape().back());
    } else if (endpoint_of(c + 1) == me()) {
      continue;
    }
    Message out(PipelineKind::GenerateStep, step_, 0, c + 1, {x});
    out.meta = {{"start", start}};
    send(c == last_chunk() ? kCoordinator : endpoint_of(c + 1), std::move(out));
    return;
  }
}

void Stage::send_state(int64_t step) {
  StateReply reply;
  std::vector<Tensor> tensors;
  // A tied parameter's copy is the source's twin: the source's stage reports it.
  std::set<std::string> copies;
  for (const TiedParameter& tie : spec_.ties) copies.insert(tie.copy);
  for (const auto& c : spec_.chunks) {
    for (const auto& [name, value] : c->named_parameters()) {
      if (copies.count(name)) continue;
      reply.weights.push_back(name);
      tensors.push_back(value.detach().to(Device::cpu()));
    }
  }
  for (const auto& [name, value] : optimizer_->state_dict()) {
    const size_t dot = name.rfind('.');
    if (dot != std::string::npos && copies.count(name.substr(0, dot))) continue;
    reply.optimizer.push_back(name);
    tensors.push_back(value.detach().to(Device::cpu()));
  }
  comm_->send(kCoordinator, to_message(reply, step, std::move(tensors)));
}

std::vector<LayerTiming> Stage::layer_timings() const {
  const StateDict optimizer_state = optimizer_->state_dict();
  std::vector<LayerTiming> timings;
  for (const auto& c : spec_.chunks) {
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

void Stage::prepare_remap(const Message& message) {
  reset();
  step_ = message.step;
  remap_prepare_ = message;
  pooled_state_ = optimizer_->state_dict();
  if (!spec_.shard_optimizer) return start_migration();
  // Every member sends its share to every other: each then holds the stage's whole state
  // until the commit. Copies, as in one process the message hands the tensors over.
  StateReply reply;
  std::vector<Tensor> tensors;
  for (const auto& [name, value] : pooled_state_) {
    reply.optimizer.push_back(name);
    tensors.push_back(value.detach().to(Device::cpu()).clone());
  }
  for (int k = 0; k < spec_.replicas; ++k) {
    if (k != spec_.replica) {
      send(replica_endpoint(k, spec_.stage, spec_.stages), to_message(reply, step_, tensors));
    }
  }
  shares_awaited_ = spec_.replicas - 1;
  for (Message& share : take_early(MessageKind::State)) pool_optimizer_state(share);
}

void Stage::pool_optimizer_state(const Message& share) {
  PIPIT_CHECK(shares_awaited_ > 0, name(), ": a replica's optimizer state arrived from ",
              endpoint_name(share.from, spec_.stages, spec_.replicas),
              " but this stage awaits none");
  const StateReply reply = read_state_reply(share);
  PIPIT_CHECK(reply.weights.empty(), name(), ": a replica's optimizer share carries weights");
  for (size_t i = 0; i < reply.optimizer.size(); ++i) {
    pooled_state_[reply.optimizer[i]] = share.tensors[i];
  }
  if (--shares_awaited_ == 0) start_migration();
}

void Stage::start_migration() {
  const RemapPrepare prepare = read_remap_prepare(*remap_prepare_);
  int64_t total = 0;
  for (int64_t count : prepare.from) total += count;
  const size_t chunks = prepare.from.size();
  migration_ = std::make_unique<LayerMigration>(
      spec_.stage, spec_.stages,
      ranges_from_counts(prepare.from, static_cast<size_t>(total), chunks),
      ranges_from_counts(prepare.to, static_cast<size_t>(total), chunks), spec_.chunks,
      std::move(pooled_state_));
  pooled_state_.clear();
  remap_prepare_.reset();
  for (Message& m : take_early(PipelineKind::LayerTransfer)) migration_->receive(m);
  advance_remap();
}

void Stage::advance_remap() {
  for (auto& [to_stage, transfer] : migration_->take_ready_transfers(step_)) {
    send(endpoint(to_stage), std::move(transfer));  // within this replica
  }
  if (staged_ || !migration_->complete()) return;
  staged_ = migration_->build(spec_.device);
  comm_->send(kCoordinator, Message(PipelineKind::RemapReady, step_));
}

void Stage::commit_remap() {
  PIPIT_CHECK(staged_, "a remap commit arrived before the stage had every layer");
  adopt(std::move(staged_->chunks), optimizer_->config(), staged_->optimizer_state);
  migration_.reset();
  staged_.reset();
  comm_->send(kCoordinator, Message(PipelineKind::RemapDone, step_));
}

void Stage::reset() {
  weights_rounded_.reset();
  remap_prepare_.reset();
  pooled_state_.clear();
  shares_awaited_ = 0;
  migration_.reset();
  staged_.reset();
  active_ = false;
  tasks_.clear();
  next_task_ = 0;
  tied_sent_ = false;
  tied_summed_ = false;
  peer_tied_.clear();
  if (replica_group_) replica_group_->reset();
  sum_order_.clear();
  ready_after_task_.clear();
  sum_shared_ = false;
  shared_count_ = 0;
  sum_position_.clear();
  final_.clear();
  generation_.clear();
  inputs_.clear();
  stash_.clear();
  recomputed_.reset();
  deferred_.clear();
  peak_stashed_ = 0;
  peak_deferred_ = 0;
  trace_.clear();
  updated_ = false;
  zero_grad();
  for (const auto& c : spec_.chunks) c->train(true);
}

}  // namespace pipit
