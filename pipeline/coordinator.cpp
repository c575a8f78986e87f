#include "pipeline/coordinator.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autograd/grad_mode.h"
#include "optim/optimizer.h"
#include "pipeline/coordinator_busy.h"
#include "pipeline/gradients/replica_group.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"

namespace pipit {
namespace {

// The endpoints not yet done, as "0, 1, 0 of replica 1".
std::string stage_list(const std::vector<bool>& done, int stages, int replicas) {
  std::string list;
  for (size_t e = 0; e < done.size(); ++e) {
    if (done[e]) continue;
    list += (list.empty() ? "" : ", ") +
            endpoint_name(static_cast<int>(e), stages, replicas).substr(6);  // without "stage "
  }
  return list;
}

}  // namespace

Coordinator::Coordinator(std::shared_ptr<Communicator> communicator, PipelineConfig config,
                         std::vector<LayerRange> ranges)
    : comm_(std::move(communicator)), config_(std::move(config)), ranges_(std::move(ranges)) {
  validate(config_);
  loss_ = make_loss(config_.loss);
  const size_t chunks = static_cast<size_t>(config_.stages) * config_.chunks_per_stage;
  PIPIT_CHECK(!ranges_.empty() &&
                  ranges_from_counts(layer_counts(ranges_), ranges_.back().end, chunks) == ranges_,
              "Coordinator: the chunk ranges ", ranges_str(ranges_), " are not ", chunks,
              " contiguous ranges from layer 0");
}

std::vector<Tensor> Coordinator::split_batch(const Tensor& batch, const char* what, int m) const {
  PIPIT_CHECK(batch.defined() && batch.dim() >= 1, "pipeline: the ", what,
              " needs a batch dimension");
  PIPIT_CHECK(batch.size(0) % m == 0, "pipeline: the ", what, " batch of ", batch.size(0),
              " (shape ", shape_str(batch.shape()), ") does not split into ", m,
              " equal microbatches");
  const int64_t size = batch.size(0) / m;
  std::vector<Tensor> parts;
  for (int i = 0; i < m; ++i) parts.push_back(narrow(batch.detach(), 0, i * size, size));
  return parts;
}

void Coordinator::send_to_all(const Message& message) {
  for (int e = 0; e < endpoints(); ++e) comm_->send(e, message);
}

void Coordinator::send_to_replica0(const Message& message) {
  for (int s = 0; s < config_.stages; ++s) comm_->send(s, message);
}

void Coordinator::require_consistent() const {
  if (inconsistent_.empty()) return;
  throw Error("pipeline: " + inconsistent_ +
              "; the stages' weights may disagree, so this pipeline refuses to go on: restore "
              "the model from the last checkpoint (train_gpt --resume) and start a new pipeline");
}

void Coordinator::begin_step(bool train, int replicas) {
  require_consistent();
  ++step_;
  grad_norm_sq_ = 0;
  stats_ = StepStats{};
  stats_.peak_stashed.assign(static_cast<size_t>(config_.stages), 0);
  stats_.peak_deferred.assign(static_cast<size_t>(config_.stages), 0);
  stats_.loss_scale = loss_scale();
  stats_.busy_us.assign(static_cast<size_t>(config_.stages), 0.0);
  StepBegin begin;
  begin.profile = train && (config_.profile_every > 0 ? step_ % config_.profile_every == 0
                                                      : policy_.has_value());
  begin.train = train;
  begin.microbatches = config_.microbatches;
  begin.trace = config_.trace;
  begin.grad_norm = train && (config_.max_grad_norm > 0 || config_.dtype == "f16");
  const Message message = to_message(begin, step_);
  for (int e = 0; e < replicas * config_.stages; ++e) comm_->send(e, message);
}

void Coordinator::fail_step(const std::string& message) {
  send_to_all(Message(PipelineKind::Abort, step_));
  throw Error("pipeline step " + std::to_string(step_) + ": " + message);
}

Message Coordinator::receive_step_message(const std::string& waiting_for) {
  while (true) {
    std::optional<Message> message = comm_->try_receive(config_.timeout);
    if (!message) {
      fail_step("no stage answered for " + std::to_string(config_.timeout.count()) +
                " ms while waiting for " + waiting_for);
    }
    if (message->kind == MessageKind::PeerLost) {
      const PeerLost lost = read_peer_lost(*message);
      fail_step("lost the connection to " +
                endpoint_name(lost.peer, config_.stages, config_.replicas) + " at " + lost.address +
                ": " + lost.reason);
    }
    if (message->from < 0 || message->from >= endpoints()) continue;  // not a stage
    if (message->step != step_) continue;  // left over from an aborted step
    if (message->kind == MessageKind::RoleError) {
      fail_step(read_role_error(*message).message);
    }
    return std::move(*message);
  }
}

void Coordinator::record_stage_done(const Message& message) {
  const StageDone done = read_stage_done(message);
  // The replicas' stages hold the same summed gradients as replica 0's: its stages speak for
  // all (norms, stashes, traces).
  if (message.from >= config_.stages) return;
  const auto stage = static_cast<size_t>(message.from);
  stats_.peak_stashed[stage] = static_cast<int>(done.peak_stashed);
  stats_.peak_deferred[stage] = static_cast<int>(done.peak_deferred);
  grad_norm_sq_ += done.grad_norm_sq.value_or(0.0);
  for (double busy : done.chunk_busy_us) stats_.busy_us[stage] += busy;
  if (!done.layers.empty()) {
    stats_.layers.insert(stats_.layers.end(), done.layers.begin(), done.layers.end());
    std::sort(stats_.layers.begin(), stats_.layers.end(),
              [](const LayerTiming& a, const LayerTiming& b) { return a.layer < b.layer; });
  }
  for (const TaskTiming& e : done.trace) {
    Task task{step_, e.microbatch, e.chunk, static_cast<Phase>(e.phase), message.from};
    trace_.add({task, e.start_us, e.end_us});
  }
}

double Coordinator::loss_scale() const {
  return config_.dtype == "f16" ? scaler_.get_scale() : 1.0;
}

OptimizerStep Coordinator::optimizer_step() {
  OptimizerStep command;
  command.lr = lr_;
  if (config_.dtype == "f16") {
    // The stages' squared norms add up to the global one, inf or NaN when any gradient is.
    stats_.skipped = !std::isfinite(grad_norm_sq_);
    scaler_.update(stats_.skipped);
    if (stats_.skipped) {
      command.skip = true;
      return command;
    }
  }
  const double unscale = 1.0 / stats_.loss_scale;
  command.grad_scale = unscale;
  if (config_.max_grad_norm > 0) {
    stats_.grad_norm = std::sqrt(grad_norm_sq_) * unscale;
    command.grad_scale = unscale * clip_coefficient(stats_.grad_norm, config_.max_grad_norm);
  }
  return command;
}

double Coordinator::train_step(const Tensor& input, const Tensor& target) {
  Busy busy(busy_, "train_step");
  const double started = trace_clock_us();
  // Replica k trains microbatches k*m .. k*m+m-1 of the n = r*m; its stage s is k*p + s.
  const int m = config_.microbatches, p = config_.stages, n = m * config_.replicas;
  std::vector<Tensor> inputs = split_batch(input, "input", n);
  const std::vector<Tensor> targets = split_batch(target, "target", n);
  begin_step(true, config_.replicas);
  for (int mb = 0; mb < n; ++mb) {
    comm_->send(replica_endpoint(mb / m, 0, p),
                {PipelineKind::Activation, step_, mb % m, 0, {inputs[static_cast<size_t>(mb)]}});
  }
  const int last_stage =
      stage_of_chunk(p * config_.chunks_per_stage - 1, p, placement_of(config_.schedule));
  std::vector<double> losses(static_cast<size_t>(n), 0.0);
  std::vector<bool> output_seen(static_cast<size_t>(n), false);
  std::vector<bool> stage_done(static_cast<size_t>(endpoints()));
  int outputs = 0, done = 0;
  while (outputs < n || done < endpoints()) {
    Message message = receive_step_message(
        outputs < n
            ? "microbatch outputs from stage " + std::to_string(last_stage)
            : "stages " + stage_list(stage_done, config_.stages, config_.replicas) + " to finish");
    if (message.kind == PipelineKind::Activation) {
      const int mb = message.from / p * m + message.microbatch;
      PIPIT_CHECK(message.from % p == last_stage && message.microbatch >= 0 &&
                      message.microbatch < m && !output_seen[static_cast<size_t>(mb)] &&
                      message.tensors.size() == 1,
                  "pipeline: unexpected output message for microbatch ", message.microbatch,
                  " from endpoint ", message.from);
      output_seen[mb] = true;
      ++outputs;
      losses[mb] = answer_output(message, targets[mb], mb, n);
    } else if (message.kind == PipelineKind::StageDone) {
      stage_done[static_cast<size_t>(message.from)] = true;
      ++done;
      record_stage_done(message);
    }
  }
  apply_optimizer_step();
  ++trained_;
  if (policy_ && !stats_.layers.empty()) rebalance((trace_clock_us() - started) / 1000.0);
  double total = 0;
  for (double loss : losses) total += loss;
  return total / n;
}

double Coordinator::answer_output(const Message& output_message, const Tensor& target_batch, int mb,
                                  int n) {
  NoGradGuard no_grad;
  const Tensor& output = output_message.tensors[0];
  const double loss_started = trace_clock_us();
  double loss = 0;
  Tensor grad;
  try {
    const Tensor target = target_batch.to(output.device());
    loss = loss_->compute_loss(output, target).item<double>();
    grad = loss_->compute_gradient(output, target) * (stats_.loss_scale / n);
  } catch (const Error& e) {
    fail_step(std::string("the loss failed on microbatch ") + std::to_string(mb) + ": " + e.what());
  }
  comm_->send(
      output_message.from,
      {PipelineKind::Gradient, step_, output_message.microbatch, output_message.chunk - 1, {grad}});
  stats_.loss_ms += (trace_clock_us() - loss_started) / 1000.0 / n;
  if (!comm_->carries_device_tensors()) {
    const double megabytes = static_cast<double>(output.nbytes() + grad.nbytes()) / 1e6;
    stats_.loss_ms += megabytes * config_.rebalance.link_ms_per_mb / n;
  }
  return loss;
}

void Coordinator::apply_optimizer_step() {
  // From here on a failure can leave some stages updated and others not: the step either
  // completes on every stage or the pipeline refuses all later work (require_consistent).
  send_to_all(to_message(optimizer_step(), step_));
  std::vector<bool> stepped(static_cast<size_t>(endpoints()));
  try {
    for (int answered = 0; answered < endpoints();) {
      Message message =
          receive_step_message("stages " + stage_list(stepped, config_.stages, config_.replicas) +
                               " to finish their optimizer step");
      if (message.kind != PipelineKind::OptimizerDone ||
          stepped[static_cast<size_t>(message.from)]) {
        continue;
      }
      stepped[static_cast<size_t>(message.from)] = true;
      ++answered;
    }
  } catch (const Error& e) {
    std::vector<bool> not_stepped(stepped.size());
    for (size_t s = 0; s < stepped.size(); ++s) not_stepped[s] = !stepped[s];
    const std::string applied = stage_list(not_stepped, config_.stages, config_.replicas);
    inconsistent_ = "step " + std::to_string(step_) + " failed during its optimizer step (" +
                    e.what() + "), after stages [" + applied +
                    "] had applied it and before stages [" +
                    stage_list(stepped, config_.stages, config_.replicas) + "] confirmed";
    require_consistent();
  }
}

LayerCosts layer_costs(const StepStats& stats, int microbatches) {
  LayerCosts costs;
  for (const LayerTiming& t : stats.layers) {
    costs.ms.push_back((t.forward_us + t.backward_us) / 1000.0 / microbatches);
    costs.output_bytes.push_back(t.output_bytes);
    costs.state_bytes.push_back(t.state_bytes);
  }
  costs.loss_ms = stats.loss_ms;
  return costs;
}

void Coordinator::enable_rebalancing(std::vector<std::string> layer_kinds) {
  PIPIT_CHECK(layer_kinds.size() == ranges_.back().end, "enable_rebalancing: ", layer_kinds.size(),
              " layer kinds for a model of ", ranges_.back().end, " layers");
  RebalanceConfig rebalance = config_.rebalance;
  rebalance.enabled = true;
  policy_.emplace(rebalance, config_.stages, config_.chunks_per_stage, std::move(layer_kinds));
}

void Coordinator::rebalance(double step_ms) {
  const int m = config_.microbatches;
  const RebalanceConfig& rc = config_.rebalance;
  recent_step_ms_.push_back(step_ms);
  if (static_cast<int>(recent_step_ms_.size()) > rc.window) {
    recent_step_ms_.erase(recent_step_ms_.begin());
  }
  if (trial_) {
    const std::optional<bool> worse = trial_->record(trained_, step_ms);
    if (worse && *worse) {
      const std::vector<LayerRange> back = trial_->before();
      const std::string why = "undone: " + trial_->summary();
      trial_.reset();
      policy_.reset();
      remap_now(back, why);
      stats_.rebalance_verdict = "rebalancing stopped for this run; remap " + why;
      return;
    }
    if (worse) trial_.reset();
  }
  const std::optional<Decision> decision =
      policy_->observe(trained_, ranges_, layer_costs(stats_, m), m);
  stats_.rebalance_verdict = policy_->verdict();
  if (!decision) return;
  const double start = trace_clock_us();
  trial_.emplace(ranges_, median_of(recent_step_ms_), trained_, rc.cooldown, rc.window,
                 rc.threshold);
  recent_step_ms_.clear();
  remap_now(decision->to, decision->reason());
  stats_.remap_ms = (trace_clock_us() - start) / 1000.0;
  stats_.rebalanced = decision;
}

void Coordinator::forward_each(const Tensor& input,
                               const std::function<void(int, const Tensor&)>& on_output) {
  const int m = config_.microbatches, p = config_.stages;
  std::vector<Tensor> inputs = split_batch(input, "input", m);
  // Inference runs on replica 0 alone: the replicas hold the same weights.
  begin_step(false, 1);
  for (int i = 0; i < m; ++i) comm_->send(0, {PipelineKind::Activation, step_, i, 0, {inputs[i]}});
  std::vector<bool> output_seen(static_cast<size_t>(m)), stage_done(static_cast<size_t>(p));
  int received = 0, done = 0;
  while (received < m || done < p) {
    Message message = receive_step_message(
        received < m ? "microbatch outputs"
                     : "stages " + stage_list(stage_done, config_.stages, config_.replicas));
    if (message.kind == PipelineKind::Activation) {
      const int mb = message.microbatch;
      PIPIT_CHECK(mb >= 0 && mb < m && !output_seen[mb] && message.tensors.size() == 1,
                  "pipeline: unexpected output message for microbatch ", mb);
      output_seen[mb] = true;
      on_output(mb, message.tensors[0]);
      ++received;
    } else if (message.kind == PipelineKind::StageDone) {
      stage_done[static_cast<size_t>(message.from)] = true;
      ++done;
      record_stage_done(message);
    }
  }
}

Tensor Coordinator::forward(const Tensor& input) {
  Busy busy(busy_, "forward");
  std::vector<Tensor> outputs(static_cast<size_t>(config_.microbatches));
  forward_each(input, [&](int mb, const Tensor& output) { outputs[mb] = output; });
  return cat(outputs, 0);
}

double Coordinator::evaluate(const Tensor& input, const Tensor& target) {
  Busy busy(busy_, "evaluate");
  const std::vector<Tensor> targets = split_batch(target, "target", config_.microbatches);
  // Each microbatch's loss as its output arrives: the whole batch's logits are not kept.
  double sum = 0;
  forward_each(input, [&](int mb, const Tensor& output) {
    sum += loss_->compute_loss(output, targets[mb]).item<double>();
  });
  return sum / config_.microbatches;
}

std::pair<StateDict, StateDict> Coordinator::fetch_state() {
  Busy busy(busy_, "fetch_state");
  require_consistent();
  ++step_;
  stats_ = StepStats{};
  stats_.peak_stashed.assign(static_cast<size_t>(config_.stages), 0);
  stats_.peak_deferred.assign(static_cast<size_t>(config_.stages), 0);
  // The replicas hold the same weights and optimizer state: replica 0 answers for all. With
  // the optimizer sharded (ZeRO-1) each replica holds its share of the state: all answer, and
  // the weights are taken from replica 0.
  const bool sharded = config_.shard_optimizer && config_.replicas > 1;
  const int answering = sharded ? endpoints() : config_.stages;
  if (sharded) {
    send_to_all(Message(PipelineKind::FetchState, step_));
  } else {
    send_to_replica0(Message(PipelineKind::FetchState, step_));
  }
  StateDict weights, optimizer_state;
  std::vector<bool> answered(static_cast<size_t>(answering));
  for (int n = 0; n < answering;) {
    Message message = receive_step_message("the state of stages " +
                                           stage_list(answered, config_.stages, config_.replicas));
    if (message.kind != MessageKind::State || message.from < 0 || message.from >= answering ||
        answered[static_cast<size_t>(message.from)]) {
      continue;
    }
    const StateReply reply = read_state_reply(message);
    size_t i = 0;
    for (const std::string& name : reply.weights) {
      if (message.from < config_.stages) weights[name] = message.tensors[i];
      ++i;
    }
    for (const std::string& name : reply.optimizer) optimizer_state[name] = message.tensors[i++];
    answered[static_cast<size_t>(message.from)] = true;
    ++n;
  }
  return {weights, optimizer_state};
}

void Coordinator::await_all(MessageKind kind, const std::string& waiting_for, int count) {
  std::vector<bool> answered(static_cast<size_t>(count));
  for (int n = 0; n < count;) {
    Message message = receive_step_message(waiting_for + " from stages " +
                                           stage_list(answered, config_.stages, config_.replicas));
    if (message.kind != kind || message.from < 0 || message.from >= count ||
        answered[static_cast<size_t>(message.from)]) {
      continue;
    }
    answered[static_cast<size_t>(message.from)] = true;
    ++n;
  }
}

void Coordinator::remap(const std::vector<LayerRange>& ranges) {
  Busy busy(busy_, "remap");
  // The user chose this partition: an automatic remap on trial is no longer judged.
  trial_.reset();
  recent_step_ms_.clear();
  remap_now(ranges, "requested");
}

void Coordinator::remap_now(const std::vector<LayerRange>& ranges, const std::string& why) {
  require_consistent();
  const size_t chunks = ranges_.size(), layers = ranges_.back().end;
  const std::string what = "remap " + ranges_str(ranges_) + " -> " + ranges_str(ranges);
  PIPIT_CHECK(remap_refusal_.empty(), what, ": ", remap_refusal_);
  // Every replica moves the same layers between its own stages, so they stay alike (a sharded
  // optimizer's replicas pool their state first: Stage::prepare_remap).
  PIPIT_CHECK(ranges.size() == chunks, what, ": ", ranges.size(), " ranges given for ", chunks,
              " chunks (", config_.stages, " stages x ", config_.chunks_per_stage, ")");
  PIPIT_CHECK(placement_of(config_.schedule) == Placement::loop, what, ": schedule \"",
              config_.schedule, "\" places its chunks in a V; layers move only between chunks ",
              "placed round-robin (every other schedule)");
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c == 0 ? 0 : ranges[c - 1].end;
    PIPIT_CHECK(ranges[c].begin == begin && ranges[c].end > ranges[c].begin, what, ": chunk ", c,
                " must start at layer ", begin, " and hold at least one layer");
  }
  PIPIT_CHECK(ranges.back().end == layers, what, ": the ranges end at layer ", ranges.back().end,
              ", but the model has ", layers, " layers");
  if (ranges == ranges_) return;
  const double start = trace_clock_us();
  ++step_;
  send_to_all(to_message(RemapPrepare{layer_counts(ranges_), layer_counts(ranges)}, step_));
  try {
    await_all(PipelineKind::RemapReady, "the layers", endpoints());
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (during " + what +
                "; nothing was committed: the stages keep the old partition)");
  }
  send_to_all(Message(PipelineKind::RemapCommit, step_));
  try {
    await_all(PipelineKind::RemapDone, "the commit", endpoints());
  } catch (const Error& e) {
    inconsistent_ = what + " failed during its commit (" + e.what() + ")";
    require_consistent();
  }
  ranges_ = ranges;
  if (config_.trace) trace_.add_remap({step_, start, trace_clock_us(), ranges_str(ranges), why});
  if (policy_) policy_->remapped(trained_, ranges_);
  if (on_remap_) on_remap_();
}

void Coordinator::shutdown() {
  send_to_all(Message(MessageKind::Shutdown, step_));
}

}  // namespace pipit
