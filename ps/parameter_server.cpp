#include "ps/parameter_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "comm/control.h"
#include "ps/messages.h"
#include "tensor/backend.h"

namespace pipit {

ParameterServer::ParameterServer(std::shared_ptr<Communicator> comm, NamedParameters parameters,
                                 PsConfig config, int shard)
    : comm_(std::move(comm)),
      parameters_(std::move(parameters)),
      config_(std::move(config)),
      shard_(shard),
      gate_(config_.workers, config_.mode == "bounded" ? config_.max_staleness : -1),
      live_(config_.workers, true),
      joined_(config_.workers, false),
      read_(config_.workers, -1),
      sums_(parameters_.size()) {
  validate(config_);
  PIPIT_CHECK(shard >= 0 && shard < config_.servers, "ParameterServer: shard ", shard,
              " is not in [0, ", config_.servers, ")");
  PIPIT_CHECK(!parameters_.empty(), "ParameterServer: shard ", shard, " holds no parameters");
  for (size_t i = 0; i < parameters_.size(); ++i) index_[parameters_[i].first] = i;
  for (auto& [name, p] : parameters_) p.zero_grad();
  optimizer_ = make_optimizer(config_.optimizer, parameters_);
}

ParameterServer::~ParameterServer() = default;

void ParameterServer::say(const std::string& line) const {
  const std::string text = "[ps shard " + std::to_string(shard_) + "] " + line;
  if (log) {
    log(text);
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
}

int ParameterServer::worker_of(int endpoint) const {
  const int worker = endpoint - config_.servers;
  return worker >= 0 && worker < config_.workers ? worker : -1;
}

std::string ParameterServer::who(int worker) const {
  return "worker " + std::to_string(worker);
}

void ParameterServer::serve() {
  auto anyone_left = [&] {
    return std::any_of(live_.begin(), live_.end(), [](bool live) { return live; });
  };
  while (anyone_left()) {
    std::optional<Message> message = comm_->try_receive(config_.timeout);
    if (!message) silent();
    const auto busy_since = std::chrono::steady_clock::now();
    struct Busy {
      std::chrono::steady_clock::time_point since;
      double& total;
      ~Busy() {
        total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
                     .count();
      }
    } busy{busy_since, stats_.busy_ms};
    if (message->from == kCoordinator && message->kind == MessageKind::Shutdown) {
      throw Error(detail::concat("parameter server shard ", shard_,
                                 ": the launcher ended the run at version ", stats_.version));
    }
    if (message->kind == MessageKind::PeerLost) {
      lost(read_peer_lost(*message));
      continue;
    }
    const int worker = worker_of(message->from);
    if (worker < 0) {
      say(std::string("ignored a ") + message_kind_name(message->kind) + " from endpoint " +
          std::to_string(message->from) + ", which is no worker of this run");
      continue;
    }
    if (!live_[worker]) continue;  // a dropped worker's late messages
    try {
      handle(worker, *message);
    } catch (const ControlError& e) {
      refuse(worker, e.what());
    }
  }
}

void ParameterServer::silent() const {
  std::string waiting;
  for (int w = 0; w < config_.workers; ++w) {
    if (live_[w]) waiting += (waiting.empty() ? "" : ", ") + std::to_string(w);
  }
  throw Error(detail::concat("parameter server shard ", shard_, ": no message for ",
                             config_.timeout.count(), " ms at version ", stats_.version,
                             " (waiting on workers ", waiting, ")"));
}

void ParameterServer::lost(const PeerLost& lost) {
  if (lost.peer == kCoordinator) {
    throw Error(detail::concat("parameter server shard ", shard_, ": lost the launcher (",
                               lost.address, ": ", lost.reason, ")"));
  }
  const int worker = worker_of(lost.peer);
  if (worker >= 0 && live_[worker])
    on_gone(worker, "lost (" + lost.address + ": " + lost.reason + ")");
}

void ParameterServer::handle(int worker, Message& message) {
  const MessageKind kind = message.kind;
  if (kind == PsKind::Join) {
    read_empty(message);
    on_join(worker);
  } else if (kind == PsKind::Push) {
    on_push(worker, message);
  } else if (kind == PsKind::Leave) {
    read_empty(message);
    live_[worker] = false;
    gate_.gone(worker);
    if (config_.mode == "sync") {
      try_sync_update();
    } else {
      grant_reads();
    }
  } else {
    say(std::string("ignored a ") + message_kind_name(kind) + " from " + who(worker));
  }
}

void ParameterServer::on_join(int worker) {
  if (joined_[worker]) {
    refuse(worker, "joined twice");
    return;
  }
  joined_[worker] = true;
  if (config_.mode == "sync") {
    send_parameters(worker);
  } else {
    waiting_reads_.push_back(worker);
    grant_reads();
  }
}

void ParameterServer::on_push(int worker, Message& message) {
  std::optional<Push> push = decode_push(worker, message);
  if (!push) return;
  if (config_.mode == "sync") {
    sync_pushes_[worker] = std::move(*push);
    try_sync_update();
  } else {
    NoGradGuard no_grad;
    read_[worker] = -1;
    gate_.pushed(worker);
    add(*push);
    if (summed_ == config_.accumulate) update();
    waiting_reads_.push_back(worker);
    grant_reads();
  }
}

std::optional<ParameterServer::Push> ParameterServer::decode_push(int worker, Message& message) {
  PsPush meta;
  try {
    meta = read_ps_push(message);
  } catch (const ControlError& e) {
    refuse(worker, e.what());
    return std::nullopt;
  }
  ++stats_.parts;
  auto part_of = parts_.find(worker);
  if (part_of == parts_.end()) {
    if (!first_part_allowed(worker, meta)) return std::nullopt;
    part_of =
        parts_.emplace(worker, Push{worker, meta.version, std::vector<Tensor>(parameters_.size())})
            .first;
  } else if (meta.version != part_of->second.version) {
    refuse(worker, detail::concat("pushed parts of one step for versions ", part_of->second.version,
                                  " and ", meta.version));
    return std::nullopt;
  }
  Push& push = part_of->second;
  for (size_t i = 0; i < meta.names.size(); ++i) {
    const auto found = index_.find(meta.names[i]);
    if (found == index_.end() || push.gradients[found->second].defined()) {
      refuse(worker, "pushed a gradient for \"" + meta.names[i] + "\", which " +
                         (found == index_.end() ? "is not a parameter of this shard"
                                                : "came twice in one step"));
      return std::nullopt;
    }
    const Tensor& param = parameters_[found->second].second;
    Tensor gradient = std::move(message.tensors[i]);  // so that add() may take it over
    const DType want = meta.compressed ? DType::bf16 : param.dtype();
    if (gradient.shape() != param.shape() || gradient.dtype() != want) {
      refuse(worker, detail::concat("pushed a gradient for \"", meta.names[i], "\" of shape ",
                                    shape_str(gradient.shape()), " ", gradient.dtype(),
                                    "; the parameter needs ", shape_str(param.shape()), " ", want));
      return std::nullopt;
    }
    stats_.pushed_bytes += static_cast<int64_t>(gradient.nbytes());
    push.gradients[found->second] =
        meta.compressed ? gradient.to(param.dtype()) : std::move(gradient);
  }
  if (!meta.last) return std::nullopt;
  Push whole = std::move(push);
  parts_.erase(part_of);
  return whole;
}

bool ParameterServer::first_part_allowed(int worker, const PsPush& meta) {
  if (!joined_[worker]) {
    refuse(worker, "pushed before joining");
    return false;
  }
  if (meta.version > stats_.version) {
    refuse(worker,
           detail::concat("pushed a gradient for version ", meta.version,
                          ", which this shard has not reached (it is at ", stats_.version, ")"));
    return false;
  }
  const bool outstanding =
      config_.mode == "sync" ? !sync_pushes_.count(worker) : meta.version == read_[worker];
  if (!outstanding || (config_.mode == "sync" && meta.version != stats_.version)) {
    refuse(worker, detail::concat("pushed a gradient for version ", meta.version,
                                  " without having read it"));
    return false;
  }
  return true;
}

void ParameterServer::refuse(int worker, const std::string& why) {
  ++stats_.refused;
  say("refused a message from " + who(worker) + ": " + why + "; nothing of it was applied");
  comm_->send(config_.worker_id(worker),
              to_message(PsError{"parameter server shard " + std::to_string(shard_) + " refused " +
                                 who(worker) + "'s push: " + why}));
  on_gone(worker, "dropped after a refused push");
}

void ParameterServer::on_gone(int worker, const std::string& why) {
  live_[worker] = false;
  gate_.gone(worker);
  parts_.erase(worker);
  stats_.lost.push_back(worker);
  say(who(worker) + " " + why);
  waiting_reads_.erase(std::remove(waiting_reads_.begin(), waiting_reads_.end(), worker),
                       waiting_reads_.end());
  if (config_.mode != "sync") {
    grant_reads();
    return;
  }
  sync_pushes_.erase(worker);
  const int live = static_cast<int>(std::count(live_.begin(), live_.end(), true));
  const int needed = config_.min_workers > 0 ? config_.min_workers : config_.workers;
  if (live < needed) {
    const std::string message =
        detail::concat("parameter server shard ", shard_, ": sync step at version ", stats_.version,
                       " lost ", who(worker), " (", why, "); ", live, " of ", config_.workers,
                       " workers left, fewer than the ", needed, " it needs");
    for (int w = 0; w < config_.workers; ++w) {
      if (live_[w]) comm_->send(config_.worker_id(w), to_message(PsError{message}));
    }
    throw Error(message);
  }
  try_sync_update();
}

void ParameterServer::try_sync_update() {
  int live = 0;
  for (int w = 0; w < config_.workers; ++w) {
    if (!live_[w]) continue;
    ++live;
    if (!sync_pushes_.count(w)) return;
  }
  if (live == 0) return;
  NoGradGuard no_grad;
  for (auto& [w, push] : sync_pushes_) add(push);  // std::map: worker order
  if (live < config_.workers) {
    // Workers scaled by 1 / workers; the live ones' mean needs 1 / live.
    const double rescale = static_cast<double>(config_.workers) / live;
    for (Tensor& sum : sums_) {
      if (sum.defined()) sum = sum * rescale;
    }
  }
  update();
  for (const auto& [w, push] : sync_pushes_) send_parameters(w);
  sync_pushes_.clear();
}

void ParameterServer::add(const Push& push) {
  // As AccumulateGrad sums: the first gradient taken over when the push alone holds it (one
  // decoded from the wire) and copied when not (a worker's own, handed over in one process),
  // the next added in place: the same bits as a + b, without a fresh tensor per push.
  for (size_t j = 0; j < sums_.size(); ++j) {
    const Tensor& g = push.gradients[j];
    if (!g.defined()) continue;
    if (!sums_[j].defined() && g.sole_owner()) {
      sums_[j] = g;
    } else if (!sums_[j].defined()) {
      sums_[j] = Tensor::empty(g.shape(), g.dtype(), g.device());
      backend(g).copy(g, sums_[j]);
    } else {
      backend(g).binary(BinaryOp::add, sums_[j], g, sums_[j]);
    }
  }
  ++summed_;
  ++stats_.gradients;
  ++stats_.staleness[stats_.version - push.version];
}

void ParameterServer::update() {
  for (size_t j = 0; j < parameters_.size(); ++j) {
    if (sums_[j].defined()) parameters_[j].second.set_grad(sums_[j]);
  }
  optimizer_->step();
  optimizer_->zero_grad();
  for (Tensor& sum : sums_) sum = Tensor();
  summed_ = 0;
  ++stats_.version;
  if (after_update) after_update(*this);
}

void ParameterServer::grant_reads() {
  for (auto it = waiting_reads_.begin(); it != waiting_reads_.end();) {
    const int worker = *it;
    if (!gate_.may_read(worker)) {
      ++it;
      continue;
    }
    ++stats_.lead[gate_.lead(worker)];
    read_[worker] = stats_.version;
    send_parameters(worker);
    it = waiting_reads_.erase(it);
  }
}

void ParameterServer::send_parameters(int worker) {
  // A message's tensors leave later than send() returns (in one process they are handed
  // over, over TCP written from where they lie), and the next update changes the parameters
  // in place: workers get a snapshot, taken once per version and shared by every reply.
  if (snapshot_version_ != stats_.version) {
    snapshot_.clear();
    for (const auto& [name, p] : parameters_) snapshot_.push_back(p.detach().clone());
    snapshot_version_ = stats_.version;
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : parameters_) names.push_back(name);
  comm_->send(config_.worker_id(worker),
              to_message(PsParameters{stats_.version, std::move(names)}, snapshot_));
}

void ParameterServer::load(const StateDict& weights, const StateDict& optimizer_state,
                           int64_t version) {
  NoGradGuard no_grad;
  PIPIT_CHECK(weights.size() == parameters_.size(), "parameter server shard ", shard_,
              ": the checkpoint holds ", weights.size(), " parameters, the shard ",
              parameters_.size(), " (was it written with another number of shards?)");
  for (auto& [name, p] : parameters_) {
    auto it = weights.find(name);
    PIPIT_CHECK(it != weights.end(), "parameter server shard ", shard_,
                ": the checkpoint lacks the parameter \"", name, "\"");
    PIPIT_CHECK(it->second.shape() == p.shape() && it->second.dtype() == p.dtype(),
                "parameter server shard ", shard_, ": the checkpoint's \"", name, "\" is ",
                shape_str(it->second.shape()), " ", it->second.dtype(), ", the parameter ",
                shape_str(p.shape()), " ", p.dtype());
    backend(p).copy(it->second, p);
  }
  optimizer_->load_state_dict(optimizer_state);
  stats_.version = version;
  snapshot_version_ = -1;
}

StateDict ParameterServer::weights() const {
  StateDict out;
  for (const auto& [name, p] : parameters_) out.emplace(name, p.detach().clone());
  return out;
}

StateDict ParameterServer::optimizer_state() const {
  return optimizer_->state_dict();
}

}  // namespace pipit
