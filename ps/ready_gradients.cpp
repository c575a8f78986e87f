#include "ps/ready_gradients.h"

#include "tensor/error.h"

namespace pipit {

ReadyGradients::ReadyGradients(const NamedParameters& parameters,
                               const std::vector<std::vector<std::string>>& shard_names,
                               int64_t part_bytes)
    : part_bytes_(part_bytes), shards_(shard_names.size()) {
  std::map<std::string, int> shard_of;
  for (size_t s = 0; s < shard_names.size(); ++s) {
    for (const std::string& name : shard_names[s]) shard_of[name] = static_cast<int>(s);
  }
  for (const auto& [name, p] : parameters) {
    const auto it = shard_of.find(name);
    if (it == shard_of.end() || !p.impl().autograd) continue;
    index_[p.impl().autograd.get()] = leaves_.size();
    leaves_.push_back({name, it->second, static_cast<int64_t>(p.nbytes())});
  }
}

void ReadyGradients::begin_step() {
  for (Shard& shard : shards_) shard = Shard{};
  for (Leaf& leaf : leaves_) {
    leaf.seen = 0;
    if (leaf.expected > 0) ++shards_[static_cast<size_t>(leaf.shard)].pending;
  }
}

PushPart ReadyGradients::take(int shard, bool last) {
  Shard& s = shards_[static_cast<size_t>(shard)];
  PushPart part{shard, std::move(s.ready), last};
  s.ready.clear();
  s.ready_bytes = 0;
  s.done = last;
  return part;
}

std::optional<PushPart> ReadyGradients::accumulated(const AutogradMeta& meta) {
  const auto it = index_.find(&meta);
  if (it == index_.end()) return std::nullopt;
  Leaf& leaf = leaves_[it->second];
  ++leaf.seen;
  if (!learned_) return std::nullopt;
  PIPIT_CHECK(leaf.seen <= leaf.expected, "parameter-server worker: \"", leaf.name, "\" got ",
              leaf.seen, " gradient accumulations this step, ", leaf.expected,
              " in the first: its backward differs, and its gradient may have been pushed "
              "before it was final (set PsConfig::overlap to false for such models)");
  if (leaf.seen < leaf.expected) return std::nullopt;
  Shard& shard = shards_[static_cast<size_t>(leaf.shard)];
  shard.ready.push_back(leaf.name);
  shard.ready_bytes += leaf.bytes;
  if (--shard.pending == 0) return take(leaf.shard, true);
  if (shard.ready_bytes >= part_bytes_) return take(leaf.shard, false);
  return std::nullopt;
}

std::vector<PushPart> ReadyGradients::end_step() {
  for (Leaf& leaf : leaves_) {
    if (!learned_) {
      leaf.expected = leaf.seen;
      if (leaf.seen > 0) shards_[static_cast<size_t>(leaf.shard)].ready.push_back(leaf.name);
    } else {
      PIPIT_CHECK(leaf.seen == leaf.expected, "parameter-server worker: \"", leaf.name, "\" got ",
                  leaf.seen, " gradient accumulations this step, ", leaf.expected,
                  " in the first: its backward differs (set PsConfig::overlap to false for such "
                  "models)");
    }
  }
  learned_ = true;
  std::vector<PushPart> parts;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!shards_[s].done) parts.push_back(take(static_cast<int>(s), true));
  }
  return parts;
}

}  // namespace pipit
