#include "pipeline/rebalancing/stage_remap.h"

#include "pipeline/gradients/stage_gradients.h"
#include "pipeline/stage.h"

namespace pipit {

StageRemap::StageRemap(Stage& stage) : stage_(stage) {
  stage.on(PipelineKind::RemapPrepare,
           {nullptr, [this](Message m) { return prepare(std::move(m)); }});
  stage.on(PipelineKind::RemapCommit,
           {nullptr, [this](Message m) { return commit(std::move(m)); }});
  // Layers come only from the stage of a neighbouring chunk (LayerMigration checks which).
  stage.on(PipelineKind::LayerTransfer,
           {[this](const Message& m) {
              const int c = m.chunk, chunks = stage_.last_chunk() + 1;
              if (c < 0 || c >= chunks || stage_.endpoint_of(c) != stage_.me()) return false;
              return (c > 0 && m.from == stage_.endpoint_of(c - 1)) ||
                     (c + 1 < chunks && m.from == stage_.endpoint_of(c + 1));
            },
            [this](Message m) { return receive_layers(std::move(m)); }});
  // A replica's share of the optimizer state, for a remap under ZeRO-1.
  stage.on(MessageKind::State,
           {[this](const Message& m) { return stage_.gradients_->member(m.from); },
            [this](Message m) { return receive_share(std::move(m)); }});
}

bool StageRemap::prepare(Message message) {
  stage_.begin(message.step);
  prepare_ = std::move(message);
  pooled_state_ = stage_.optimizer_->state_dict();
  const StageSpec& spec = stage_.spec_;
  if (!spec.shard_optimizer) {
    start_migration();
    return true;
  }
  // Every member sends its share to every other: each then holds the stage's whole state
  // until the commit. Copies, as in one process the message hands the tensors over.
  StateReply reply;
  std::vector<Tensor> tensors;
  for (const auto& [name, value] : pooled_state_) {
    reply.optimizer.push_back(name);
    tensors.push_back(value.detach().to(Device::cpu()).clone());
  }
  for (int k = 0; k < spec.replicas; ++k) {
    if (k != spec.replica) {
      stage_.send(replica_endpoint(k, spec.stage, spec.stages),
                  to_message(reply, stage_.step(), tensors));
    }
  }
  shares_awaited_ = spec.replicas - 1;
  for (Message& share : stage_.take_early(MessageKind::State)) pool(share);
  return true;
}

bool StageRemap::receive_share(Message message) {
  if (message.step > stage_.step()) {
    stage_.keep_early(std::move(message));
  } else if (message.step == stage_.step() && shares_awaited_ > 0) {
    pool(message);
  }
  return true;
}

void StageRemap::pool(const Message& share) {
  const StageSpec& spec = stage_.spec_;
  PIPIT_CHECK(shares_awaited_ > 0, stage_.name(), ": a replica's optimizer state arrived from ",
              endpoint_name(share.from, spec.stages, spec.replicas), " but this stage awaits none");
  const StateReply reply = read_state_reply(share);
  PIPIT_CHECK(reply.weights.empty(), stage_.name(),
              ": a replica's optimizer share carries weights");
  for (size_t i = 0; i < reply.optimizer.size(); ++i) {
    pooled_state_[reply.optimizer[i]] = share.tensors[i];
  }
  if (--shares_awaited_ == 0) start_migration();
}

void StageRemap::start_migration() {
  const RemapPrepare prepare = read_remap_prepare(*prepare_);
  int64_t total = 0;
  for (int64_t count : prepare.from) total += count;
  const size_t chunks = prepare.from.size();
  const StageSpec& spec = stage_.spec_;
  migration_ = std::make_unique<LayerMigration>(
      spec.stage, spec.stages, ranges_from_counts(prepare.from, static_cast<size_t>(total), chunks),
      ranges_from_counts(prepare.to, static_cast<size_t>(total), chunks), spec.chunks,
      std::move(pooled_state_));
  pooled_state_.clear();
  prepare_.reset();
  for (Message& m : stage_.take_early(PipelineKind::LayerTransfer)) migration_->receive(m);
  advance();
}

bool StageRemap::receive_layers(Message message) {
  // Early also while this stage's replicas pool their optimizer state (ZeRO-1).
  if (message.step > stage_.step() || (message.step == stage_.step() && prepare_)) {
    stage_.keep_early(std::move(message));
  } else if (migration_ && message.step == stage_.step()) {
    migration_->receive(message);
    advance();
  }
  return true;
}

void StageRemap::advance() {
  for (auto& [to_stage, transfer] : migration_->take_ready_transfers(stage_.step())) {
    stage_.send(stage_.endpoint(to_stage), std::move(transfer));  // within this replica
  }
  if (staged_ || !migration_->complete()) return;
  staged_ = migration_->build(stage_.spec_.device);
  stage_.send_to_coordinator(Message(PipelineKind::RemapReady, stage_.step()));
}

bool StageRemap::commit(Message message) {
  if (message.step != stage_.step()) return true;
  PIPIT_CHECK(staged_, "a remap commit arrived before the stage had every layer");
  stage_.adopt(std::move(staged_->chunks), stage_.optimizer_->config(), staged_->optimizer_state);
  migration_.reset();
  staged_.reset();
  stage_.send_to_coordinator(Message(PipelineKind::RemapDone, stage_.step()));
  return true;
}

void StageRemap::reset() {
  prepare_.reset();
  pooled_state_.clear();
  shares_awaited_ = 0;
  migration_.reset();
  staged_.reset();
}

}  // namespace pipit
