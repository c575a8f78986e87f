#include "pipeline/replica_group.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
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

ReplicaGroup::ReplicaGroup(int stage, int stages, int replica, int replicas)
    : me_(replica_endpoint(replica, stage, stages)) {
  PIPIT_CHECK(replicas >= 1 && replica >= 0 && replica < replicas && stage >= 0 && stage < stages,
              "ReplicaGroup: stage ", stage, " of ", stages, ", replica ", replica, " of ",
              replicas, " is not a place in the pipelines");
  for (int k = 0; k < replicas; ++k) members_.push_back(replica_endpoint(k, stage, stages));
}

bool ReplicaGroup::member(int endpoint) const {
  return endpoint != me_ && std::find(members_.begin(), members_.end(), endpoint) != members_.end();
}

AllReduce::Outgoing ReplicaGroup::start(const std::vector<Tensor>& parameters, int64_t step) {
  PIPIT_CHECK(!reduce_, "ReplicaGroup: the gradients of step ", step, " are already being summed");
  NoGradGuard no_grad;
  parameters_ = parameters;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters_) {
    const Tensor grad = p.grad().defined() ? p.grad() : zeros_like(p);
    PIPIT_CHECK(grads.empty() || grad.dtype() == grads.front().dtype(),
                "ReplicaGroup: the gradients of one stage must share a dtype to be summed "
                "together, got ",
                grads.front().dtype(), " and ", grad.dtype());
    grads.push_back(reshape(grad, {grad.numel()}));
  }
  flat_ = grads.empty() ? zeros({0}) : cat(grads, 0);
  reduce_.emplace(members_, me_, flat_, step);
  AllReduce::Outgoing out = reduce_->start();
  std::vector<Message> pending = std::move(pending_);
  pending_.clear();
  for (const Message& message : pending) {
    if (message.step != step) continue;  // an aborted step's
    for (auto& next : take(message)) out.push_back(std::move(next));
  }
  write_back_when_done();  // a group of one is done at once
  return out;
}

AllReduce::Outgoing ReplicaGroup::receive(const Message& message) {
  if (!reduce_) {
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
  if (!reduce_->done() || written_) return;
  // Views of the sum, one per parameter, in the order they were flattened.
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (Tensor& p : parameters_) {
    const int64_t n = p.numel();
    p.set_grad(view(narrow(flat_, 0, offset, n), p.shape()));
    offset += n;
  }
  written_ = true;
}

void ReplicaGroup::reset() {
  reduce_.reset();
  parameters_.clear();
  flat_ = Tensor();
  pending_.clear();
  written_ = false;
}

}  // namespace pipit
