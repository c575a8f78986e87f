#include "ps/worker.h"

#include <chrono>
#include <optional>
#include <thread>

#include "autograd/accumulation_hook.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "comm/control.h"
#include "ps/messages.h"

namespace pipit {
namespace {
using Clock = std::chrono::steady_clock;
// A push leaves once this many bytes of a shard's gradients are final (or the shard's are all
// final): about a layer of a small model per message, few messages for a large one.
constexpr int64_t kPushPartBytes = int64_t{1} << 20;
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}
}  // namespace

PsWorker::PsWorker(std::shared_ptr<Communicator> comm, std::shared_ptr<Module> model,
                   PsConfig config, int index, double slowdown)
    : comm_(std::move(comm)),
      model_(std::move(model)),
      config_(std::move(config)),
      index_(index),
      slowdown_(slowdown),
      loss_(make_loss(config_.loss)),
      versions_(config_.servers, -1),
      shard_names_(config_.servers) {
  validate(config_);
  PIPIT_CHECK(index >= 0 && index < config_.workers, "PsWorker: index ", index, " is not in [0, ",
              config_.workers, ")");
  PIPIT_CHECK(slowdown >= 1, "PsWorker: slowdown must be >= 1, got ", slowdown);
}

void PsWorker::join() {
  for (int s = 0; s < config_.servers; ++s) {
    comm_->send(config_.server_id(s), Message(PsKind::Join, 0));
  }
  receive_parameters(std::vector<bool>(config_.servers, true));
}

double PsWorker::step(const Tensor& input, const Tensor& target) {
  PIPIT_CHECK(versions_[0] >= 0, "PsWorker ", index_, ": step() before join()");
  step_start_ = Clock::now();
  pushing_ms_ = slept_ms_ = 0;
  model_->zero_grad();
  Tensor output = model_->forward(input);
  const double loss = loss_->compute_loss(output, target).item<double>();
  const StateDict parameters = model_->state_dict();
  if (config_.overlap && !ready_) {
    ready_ =
        std::make_unique<ReadyGradients>(model_->named_parameters(), shard_names_, kPushPartBytes);
  }
  {
    std::optional<AccumulationHook> hook;
    if (ready_) {
      ready_->begin_step();
      hook.emplace([&](const AutogradMeta& leaf) {
        if (std::optional<PushPart> part = ready_->accumulated(leaf)) push(*part, parameters);
      });
    }
    output.backward(loss_->compute_gradient(output, target) * (1.0 / config_.gradient_group()));
  }
  if (ready_) {
    for (const PushPart& part : ready_->end_step()) push(part, parameters);
  } else {
    for (int s = 0; s < config_.servers; ++s) push({s, shard_names_[s], true}, parameters);
  }
  stretch();
  stats_.compute_ms += ms_since(step_start_) - pushing_ms_;

  const auto wait_start = Clock::now();
  receive_parameters(std::vector<bool>(config_.servers, true));
  stats_.wait_ms += ms_since(wait_start);
  ++stats_.steps;
  return loss;
}

void PsWorker::stretch() {
  if (slowdown_ <= 1) return;
  const double computed = ms_since(step_start_) - pushing_ms_ - slept_ms_;
  const double sleep = computed * (slowdown_ - 1) - slept_ms_;
  if (sleep <= 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(sleep));
  slept_ms_ += sleep;
}

void PsWorker::push(const PushPart& part, const StateDict& parameters) {
  stretch();
  const auto start = Clock::now();
  PsPush push{versions_[part.shard], {}, config_.compress, part.last};
  std::vector<Tensor> gradients;
  for (const std::string& name : part.names) {
    const Tensor gradient = parameters.at(name).grad();
    if (!gradient.defined()) continue;
    push.names.push_back(name);
    stats_.uncompressed_bytes += static_cast<int64_t>(gradient.nbytes());
    gradients.push_back(config_.compress ? compressor_.compress(name, gradient) : gradient);
    stats_.pushed_bytes += static_cast<int64_t>(gradients.back().nbytes());
  }
  comm_->send(config_.server_id(part.shard), to_message(push, std::move(gradients)));
  const double took = ms_since(start);
  stats_.push_ms += took;
  pushing_ms_ += took;
}

void PsWorker::receive_parameters(std::vector<bool> pending) {
  auto shard_of = [&](int endpoint) {
    return endpoint >= 0 && endpoint < config_.servers ? endpoint : -1;
  };
  int remaining = static_cast<int>(pending.size());
  while (remaining > 0) {
    std::optional<Message> message = comm_->try_receive(config_.timeout);
    if (!message) {
      std::string shards;
      for (int s = 0; s < config_.servers; ++s) {
        if (pending[s]) shards += (shards.empty() ? "" : ", ") + std::to_string(s);
      }
      throw Error(detail::concat("parameter-server worker ", index_, ": no parameters from shard ",
                                 shards, " within ", config_.timeout.count(), " ms"));
    }
    if (message->from == kCoordinator && message->kind == MessageKind::Shutdown) {
      throw Error(
          detail::concat("parameter-server worker ", index_, ": the launcher ended the run"));
    }
    if (message->kind == MessageKind::PeerLost) {
      const PeerLost lost = read_peer_lost(*message);
      if (lost.peer == kCoordinator) {
        throw Error(detail::concat("parameter-server worker ", index_, ": lost the launcher (",
                                   lost.address, ": ", lost.reason, ")"));
      }
      if (shard_of(lost.peer) < 0) continue;
      throw Error(detail::concat("parameter-server worker ", index_, ": lost server shard ",
                                 lost.peer, " at ", lost.address, " (", lost.reason, ")"));
    }
    if (message->kind == PsKind::Error) {
      throw Error(detail::concat("parameter-server worker ", index_, ": ",
                                 read_ps_error(*message).message));
    }
    const int s = shard_of(message->from);
    if (message->kind != PsKind::Parameters || s < 0 || !pending[s]) continue;
    PsParameters parameters = read_ps_parameters(*message);
    StateDict values;
    for (size_t i = 0; i < parameters.names.size(); ++i) {
      values.emplace(parameters.names[i], message->tensors[i]);
    }
    model_->load_state_dict(values, /*strict=*/false);
    shard_names_[s] = std::move(parameters.names);
    versions_[s] = parameters.version;
    pending[s] = false;
    --remaining;
  }
}

void PsWorker::leave() {
  for (int s = 0; s < config_.servers; ++s) {
    comm_->send(config_.server_id(s), Message(PsKind::Leave, 0));
  }
}

}  // namespace pipit
