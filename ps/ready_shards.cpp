#include "ps/ready_shards.h"

#include "tensor/error.h"

namespace pipit {

ReadyShards::ReadyShards(const NamedParameters& parameters,
                         const std::vector<std::vector<std::string>>& shard_names)
    : pending_(shard_names.size(), 0), ready_(shard_names.size(), false) {
  std::map<std::string, int> shard_of;
  for (size_t s = 0; s < shard_names.size(); ++s) {
    for (const std::string& name : shard_names[s]) shard_of[name] = static_cast<int>(s);
  }
  for (const auto& [name, p] : parameters) {
    const auto it = shard_of.find(name);
    if (it == shard_of.end() || !p.impl().autograd) continue;
    index_[p.impl().autograd.get()] = leaves_.size();
    leaves_.push_back({name, it->second});
  }
}

void ReadyShards::begin_step() {
  std::fill(pending_.begin(), pending_.end(), 0);
  std::fill(ready_.begin(), ready_.end(), false);
  for (Leaf& leaf : leaves_) {
    leaf.seen = 0;
    if (leaf.expected > 0) ++pending_[static_cast<size_t>(leaf.shard)];
  }
}

int ReadyShards::accumulated(const AutogradMeta& leaf) {
  const auto it = index_.find(&leaf);
  if (it == index_.end()) return -1;
  Leaf& l = leaves_[it->second];
  const auto shard = static_cast<size_t>(l.shard);
  ++l.seen;
  if (!learned_ || ready_[shard]) {
    PIPIT_CHECK(!ready_[shard], "parameter-server worker: \"", l.name,
                "\" got a gradient after its shard's push left; its backward differs from the "
                "first step's (set PsConfig::overlap to false for such models)");
    return -1;
  }
  if (l.seen != l.expected || --pending_[shard] > 0) return -1;
  ready_[shard] = true;
  return l.shard;
}

std::vector<int> ReadyShards::end_step() {
  for (Leaf& leaf : leaves_) {
    if (!learned_) {
      leaf.expected = leaf.seen;
    } else {
      PIPIT_CHECK(leaf.seen == leaf.expected || !ready_[static_cast<size_t>(leaf.shard)],
                  "parameter-server worker: \"", leaf.name, "\" had ", leaf.seen,
                  " gradient accumulations this step and ", leaf.expected,
                  " in the first; its shard was pushed before it was final");
    }
  }
  learned_ = true;
  std::vector<int> left;
  for (size_t s = 0; s < ready_.size(); ++s) {
    if (!ready_[s]) left.push_back(static_cast<int>(s));
  }
  return left;
}

}  // namespace pipit
