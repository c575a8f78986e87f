#pragma once
// ReadyShards: during a worker's backward, which shards' gradients are final, so that each
// shard's push leaves while the backward goes on with the layers below (PsConfig::overlap).
// A parameter's gradient is final once it has had as many accumulations as it had in the
// first step (a parameter used twice, as a tied embedding is, gets two); the first step
// learns the counts and pushes after its backward. A later step whose backward differs from
// the first's after a shard was pushed is an Error naming the parameter.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace pipit {

class ReadyShards {
 public:
  // `shard_names`: each shard's parameter names, as the shards sent them.
  ReadyShards(const NamedParameters& parameters,
              const std::vector<std::vector<std::string>>& shard_names);

  void begin_step();
  // `leaf`'s gradient grew; the shard whose gradients that made final, or -1.
  int accumulated(const AutogradMeta& leaf);
  // The backward is done: the shards whose gradients were not yet pushed, in shard order.
  std::vector<int> end_step();

 private:
  struct Leaf {
    std::string name;
    int shard = -1;
    int64_t expected = -1;  // accumulations per step; -1 until the first step ends
    int64_t seen = 0;
  };

  std::map<const AutogradMeta*, size_t> index_;
  std::vector<Leaf> leaves_;
  std::vector<int64_t> pending_;  // per shard: leaves not yet final this step
  std::vector<bool> ready_;       // per shard: returned by accumulated() this step
  bool learned_ = false;
};

}  // namespace pipit
