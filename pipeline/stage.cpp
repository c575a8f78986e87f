#include "pipeline/stage.h"

#include <set>
#include <sstream>

#include "pipeline/generation/stage_generation.h"
#include "pipeline/gradients/stage_gradients.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/rebalancing/stage_remap.h"
#include "pipeline/schedules/task_runner.h"
#include "pipit.h"

namespace pipit {

Stage::Stage(StageSpec spec, std::shared_ptr<Communicator> communicator)
    : spec_(std::move(spec)),
      comm_(std::move(communicator)),
      stream_(spec_.device.is_cuda() ? Stream::create(spec_.device)
                                     : Stream::default_stream(spec_.device)) {
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
  on(MessageKind::Shutdown, {nullptr, [](Message) { return false; }});
  on(PipelineKind::StepBegin, {nullptr, [this](Message m) {
                                 begin_step(m);
                                 return true;
                               }});
  on(PipelineKind::Abort, {nullptr, [this](Message m) {
                             if (m.step == step_) reset();
                             return true;
                           }});
  on(PipelineKind::FetchState, {nullptr, [this](Message m) {
                                  send_state(m.step);
                                  return true;
                                }});
  on(MessageKind::PeerLost, {nullptr, [this](Message m) { return peer_lost(m); }});
  tasks_ = std::make_unique<TaskRunner>(*this);
  gradients_ = std::make_unique<StageGradients>(*this);
  remap_ = std::make_unique<StageRemap>(*this);
  generation_ = std::make_unique<StageGeneration>(*this);
  adopt(std::move(spec_.chunks), spec_.optimizer, spec_.optimizer_state);
  spec_.optimizer_state.clear();
}

Stage::~Stage() = default;

void Stage::on(MessageKind kind, Handler handler) {
  handlers_[kind] = std::move(handler);
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
  auto made = make_optimizer(optimizer, gradients_->owned(std::move(parameters), tensors));
  if (!optimizer_state.empty()) {
    made->load_state_dict(
        optimizer_state_for(with_tied_copies(optimizer_state, spec_.ties), made->parameters()));
  }
  spec_.chunks = std::move(chunks);
  parameters_ = std::move(tensors);
  norm_parameters_ = std::move(counted);
  optimizer_ = std::move(made);
}

int Stage::local_chunk(int global_chunk) const {
  return pipit::local_chunk(global_chunk, spec_.stages, placement_of(spec_.schedule));
}

Sequential& Stage::chunk(int global_chunk) {
  return *spec_.chunks[static_cast<size_t>(local_chunk(global_chunk))];
}

int Stage::endpoint(int stage) const {
  return replica_endpoint(spec_.replica, stage, spec_.stages);
}

int Stage::endpoint_of(int chunk) const {
  return endpoint(stage_of_chunk(chunk, spec_.stages, placement_of(spec_.schedule)));
}

std::string Stage::name() const {
  return endpoint_name(me(), spec_.stages, spec_.replicas);
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
  tasks_->reset();
}

Message Stage::next_message() {
  if (interrupted_.empty()) return comm_->receive();
  Message message = std::move(interrupted_.front());
  interrupted_.pop_front();
  return message;
}

void Stage::pump(const std::function<bool(const Message&)>& take) {
  // Bounded like early_: beyond that, messages wait in the communicator until the task ends.
  while (interrupted_.size() < kMaxEarlyMessages) {
    std::optional<Message> message = comm_->try_receive(std::chrono::milliseconds(0));
    if (!message) return;
    if (!accepts(*message) || !take(*message)) interrupted_.push_back(std::move(*message));
  }
}

void Stage::report_error(const std::string& message) {
  try {
    comm_->send(kCoordinator, to_message(RoleError{name(), message}, step_));
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
    tasks_->store(std::move(message));
    return;
  }
  comm_->send(to, std::move(message));
}

void Stage::send_to_coordinator(Message message) {
  comm_->send(kCoordinator, std::move(message));
}

bool Stage::handle(Message message) {
  std::ostringstream what;
  try {
    // Commands only from the coordinator, data only from the stage that produces it: anything
    // else (a confused or hostile peer of the same run) is dropped.
    if (!accepts(message)) return true;
    return handlers_.at(message.kind).handle(std::move(message));
  } catch (const std::exception& e) {
    what << name() << " failed";
    if (const Task* task = tasks_->current()) what << " in task " << *task;
    what << " of step " << step_ << ": " << e.what();
  } catch (...) {
    what << name() << " failed in step " << step_ << " on an unknown exception";
  }
  reset();
  report_error(what.str());
  return true;
}

bool Stage::accepts(const Message& message) const {
  const auto handler = handlers_.find(message.kind);
  if (handler == handlers_.end()) return false;
  if (is_coordinator_command(message.kind)) return message.from == kCoordinator;
  return !handler->second.accepts || handler->second.accepts(message);
}

bool Stage::peer_lost(const Message& message) {
  const PeerLost lost = read_peer_lost(message);
  if (lost.peer == kCoordinator) return false;  // the run is over
  // A neighbour is gone: this step cannot finish, and the coordinator should know why.
  reset();
  report_error(name() + " lost its connection to " +
               endpoint_name(lost.peer, spec_.stages, spec_.replicas) + " at " + lost.address +
               ": " + lost.reason);
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

void Stage::begin(int64_t step) {
  reset();
  step_ = step;
}

void Stage::begin_step(const Message& message) {
  const StepBegin step_begin = read_step_begin(message);
  begin(message.step);
  report_grad_norm_ = step_begin.grad_norm;
  tasks_->begin(step_begin);
  gradients_->begin_step();
  advance();
}

void Stage::advance() {
  if (tasks_->run_ready()) gradients_->after_tasks();
}

void Stage::finish_step() {
  StageDone done;
  if (tasks_->tracing()) {
    if (const std::optional<TraceEvent> sum = gradients_->sum_event()) tasks_->add_trace(*sum);
  }
  tasks_->report(done);
  if (report_grad_norm_) done.grad_norm_sq = grad_norm_squared(norm_parameters_);
  tasks_->end_step();
  comm_->send(kCoordinator, to_message(done, step_));
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

void Stage::zero_grad() {
  for (Tensor& p : parameters_) p.zero_grad();
}

void Stage::reset() {
  remap_->reset();
  tasks_->reset();
  gradients_->reset();
  generation_->reset();
  zero_grad();
  for (const auto& c : spec_.chunks) c->train(true);
}

}  // namespace pipit
