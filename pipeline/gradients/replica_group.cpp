#include "pipeline/gradients/replica_group.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "pipeline/protocol/messages.h"
#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

// More segments than any real stage's gradients need; a peer cannot make a member keep more.
constexpr size_t kMaxPendingSegments = 1 << 16;

}  // namespace

std::string endpoint_name(int endpoint, int stages, int replicas) {
  const std::string stage = "stage " + std::to_string(endpoint % stages);
  return replicas > 1 ? stage + " of replica " + std::to_string(endpoint / stages) : stage;
}

ReplicaGroup::ReplicaGroup(int stage, int stages, int replica, int replicas, Communicator* comm)
    : me_(replica_endpoint(replica, stage, stages)), comm_(comm), replica_(replica) {
  PIPIT_CHECK(replicas >= 1 && replica >= 0 && replica < replicas && stage >= 0 && stage < stages,
              "ReplicaGroup: stage ", stage, " of ", stages, ", replica ", replica, " of ",
              replicas, " is not a place in the pipelines");
  for (int k = 0; k < replicas; ++k) members_.push_back(replica_endpoint(k, stage, stages));
}

bool ReplicaGroup::member(int endpoint) const {
  return endpoint != me_ && std::find(members_.begin(), members_.end(), endpoint) != members_.end();
}

AllReduce::Outgoing ReplicaGroup::begin(const std::vector<Tensor>& parameters, int64_t step) {
  PIPIT_CHECK(!begun_, "ReplicaGroup: the gradients of step ", step, " are already being summed");
  parameters_ = parameters;
  offsets_.assign(1, 0);
  for (const Tensor& p : parameters_) {
    PIPIT_CHECK(p.dtype() == parameters_.front().dtype(),
                "ReplicaGroup: the parameters of one stage must share a dtype to be summed "
                "together, got ",
                parameters_.front().dtype(), " and ", p.dtype());
    offsets_.push_back(offsets_.back() + p.numel());
  }
  flat_ = parameters_.empty() ? zeros({0})
                              : zeros({offsets_.back()},
                                      {parameters_.front().dtype(), parameters_.front().device()});
  ready_count_ = 0;
  begun_ = true;
  step_ = step;
  const int peer = members_[members_[0] == me_ ? 1 : 0];
  paired_ = members_.size() == 2 && comm_ && flat_.device().is_cpu() &&
            comm_->has_pair_sum(peer, flat_.dtype());
  if (paired_) {
    pending_.clear();
    parts_done_.clear();
    write_back_when_done();
    return {};
  }
  reduce_.emplace(members_, me_, flat_, step, int64_t{1} << 20, 0);
  AllReduce::Outgoing out = reduce_->start();
  std::vector<Message> pending = std::move(pending_);
  pending_.clear();
  for (const Message& message : pending) {
    if (message.step != step) continue;  // an aborted step's
    for (auto& next : take(message)) out.push_back(std::move(next));
  }
  write_back_when_done();  // a stage without parameters has nothing to wait for
  return out;
}

AllReduce::Outgoing ReplicaGroup::ready(size_t count) {
  PIPIT_CHECK(begun_ && count >= ready_count_ && count <= parameters_.size(),
              "ReplicaGroup: ", count, " ready parameters after ", ready_count_, " of ",
              parameters_.size());
  NoGradGuard no_grad;
  for (size_t i = ready_count_; i < count; ++i) {
    const Tensor& p = parameters_[i];
    const Tensor slot = narrow(flat_, 0, offsets_[i], p.numel());
    if (!p.grad().defined()) continue;  // zeros, as flat_ starts
    PIPIT_CHECK(p.grad().dtype() == flat_.dtype(), "ReplicaGroup: a gradient of dtype ",
                p.grad().dtype(), " for a ", flat_.dtype(), " parameter");
    backend(slot).copy(reshape(p.grad(), {p.numel()}), slot);
  }
  const size_t first = ready_count_;
  ready_count_ = count;
  if (paired_) {
    if (count > first) {
      const int peer = members_[members_[0] == me_ ? 1 : 0];
      comm_->start_pair_sum(peer,
                            narrow(flat_, 0, offsets_[first], offsets_[count] - offsets_[first]),
                            step_, static_cast<int>(parts_done_.size()));
      parts_done_.push_back(false);
    }
    write_back_when_done();
    return {};
  }
  AllReduce::Outgoing out = reduce_->make_ready(offsets_[count]);
  write_back_when_done();
  return out;
}

void ReplicaGroup::pair_sum_done(const Message& message) {
  const int part = message.microbatch;
  PIPIT_CHECK(paired_ && message.step == step_ && part >= 0 &&
                  static_cast<size_t>(part) < parts_done_.size() &&
                  !parts_done_[static_cast<size_t>(part)],
              "ReplicaGroup: PairSumDone for part ", part, " of step ", message.step,
              ", which this group did not start or already has");
  parts_done_[static_cast<size_t>(part)] = true;
  write_back_when_done();
}

AllReduce::Outgoing ReplicaGroup::receive(const Message& message) {
  PIPIT_CHECK(!paired_, "ReplicaGroup: an AllReduceSegment from endpoint ", message.from,
              " while this group sums with its communicator's pair sum");
  if (!begun_) {
    PIPIT_CHECK(pending_.size() < kMaxPendingSegments, "ReplicaGroup: more than ",
                kMaxPendingSegments, " gradient segments arrived before this stage's backward");
    pending_.push_back(message);
    return {};
  }
  return take(message);
}

AllReduce::Outgoing ReplicaGroup::take(const Message& message) {
  AllReduce::Outgoing out = reduce_->receive(message);
  write_back_when_done();
  return out;
}

void ReplicaGroup::write_back_when_done() {
  if (!all_ready() || written_) return;
  const bool summed =
      paired_ ? std::all_of(parts_done_.begin(), parts_done_.end(), [](bool done) { return done; })
              : reduce_->done();
  if (!summed) return;
  // Views of the sum, one per parameter, in the order they were flattened.
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    p.set_grad(view(narrow(flat_, 0, offsets_[i], p.numel()), p.shape()));
  }
  written_ = true;
}

void ReplicaGroup::reset() {
  reduce_.reset();
  begun_ = false;
  paired_ = false;
  parts_done_.clear();
  parameters_.clear();
  offsets_.clear();
  ready_count_ = 0;
  flat_ = Tensor();
  pending_.clear();
  written_ = false;
  gather_step_ = -1;
  gathered_.clear();
}

std::vector<int> ReplicaGroup::shard_owners(const std::vector<Tensor>& parameters, int replicas) {
  std::vector<size_t> order(parameters.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return parameters[a].numel() > parameters[b].numel();
  });
  std::vector<int64_t> load(static_cast<size_t>(replicas), 0);
  std::vector<int> owners(parameters.size());
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    owners[i] = static_cast<int>(least - load.begin());
    *least += parameters[i].numel();
  }
  return owners;
}

const std::vector<int>& ReplicaGroup::shard(std::vector<Tensor> parameters) {
  owners_ = shard_owners(parameters, static_cast<int>(members_.size()));
  shard_parameters_ = std::move(parameters);
  return owners_;
}

AllReduce::Outgoing ReplicaGroup::share_parameters(int64_t step) {
  if (gather_step_ != step) {
    gather_step_ = step;
    gathered_.assign(members_.size(), false);
  }
  gathered_[static_cast<size_t>(replica_)] = true;
  std::vector<Tensor> mine;
  for (size_t i = 0; i < shard_parameters_.size(); ++i) {
    // A copy: a communicator in one process hands the receivers the tensor itself.
    if (owners_[i] == replica_) mine.push_back(shard_parameters_[i].detach().clone());
  }
  const int r = static_cast<int>(members_.size());
  if (r == 1) return {};
  AllReduce::Outgoing out;
  out.emplace_back(members_[static_cast<size_t>((replica_ + 1) % r)],
                   Message(PipelineKind::ParameterShard, step, replica_, 0, std::move(mine)));
  return out;
}

AllReduce::Outgoing ReplicaGroup::receive_parameters(const Message& message) {
  const int r = static_cast<int>(members_.size());
  const int origin = message.microbatch;
  PIPIT_CHECK(origin >= 0 && origin < r && origin != replica_, "ParameterShard of step ",
              message.step, ": replica ", origin, " is not another member of this group");
  const int previous = members_[static_cast<size_t>((replica_ + r - 1) % r)];
  PIPIT_CHECK(message.from == previous, "ParameterShard of replica ", origin,
              " came from endpoint ", message.from, ", which does not pass it to endpoint ", me_);
  if (gather_step_ != message.step) {
    gather_step_ = message.step;
    gathered_.assign(members_.size(), false);
  }
  PIPIT_CHECK(!gathered_[static_cast<size_t>(origin)], "ParameterShard of replica ", origin,
              " arrived twice in step ", message.step);
  std::vector<size_t> owned;
  for (size_t i = 0; i < owners_.size(); ++i) {
    if (owners_[i] == origin) owned.push_back(i);
  }
  PIPIT_CHECK(message.tensors.size() == owned.size(), "ParameterShard of replica ", origin,
              " carries ", message.tensors.size(), " tensors, expected ", owned.size());
  for (size_t j = 0; j < owned.size(); ++j) {
    const Tensor& target = shard_parameters_[owned[j]];
    PIPIT_CHECK(message.tensors[j].shape() == target.shape() &&
                    message.tensors[j].dtype() == target.dtype(),
                "ParameterShard of replica ", origin, ": tensor ", j, " is not one ",
                target.dtype(), " tensor of shape ", shape_str(target.shape()));
  }
  NoGradGuard no_grad;
  for (size_t j = 0; j < owned.size(); ++j) {
    const Tensor& target = shard_parameters_[owned[j]];
    backend(target).copy(message.tensors[j].to(target.device()), target);
  }
  gathered_[static_cast<size_t>(origin)] = true;
  AllReduce::Outgoing out;
  const int next = (replica_ + 1) % r;
  if (next != origin) out.emplace_back(members_[static_cast<size_t>(next)], message);
  return out;
}

bool ReplicaGroup::parameters_gathered() const {
  return !gathered_.empty() &&
         std::all_of(gathered_.begin(), gathered_.end(), [](bool b) { return b; });
}

}  // namespace pipit
