#pragma once
// ReadyGradients: during a worker's backward, which gradients are final and which go to their
// shard together, so that pushes leave layer by layer while the backward goes on with the
// layers below (PsConfig::overlap). A parameter's gradient is final once it has had as many
// accumulations as in the first step (a parameter used twice, as a tied embedding is, gets
// two); the first step learns the counts and pushes after its backward. Final gradients
// gather per shard until they reach `part_bytes` or complete the shard, whose last part
// says so. A later step whose backward differs from the first's is an Error naming the
// parameter.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace pipit {

struct PushPart {
  int shard = 0;
  std::vector<std::string> names;  // their gradients are final
  bool last = false;               // the shard's final part of the step
};

class ReadyGradients {
 public:
  // `shard_names`: each shard's parameter names, as the shards sent them.
  ReadyGradients(const NamedParameters& parameters,
                 const std::vector<std::vector<std::string>>& shard_names, int64_t part_bytes);

  void begin_step();
  // `leaf`'s gradient grew: the part that made ready to go, if any.
  std::optional<PushPart> accumulated(const AutogradMeta& leaf);
  // The backward is done: the last part of every shard whose last part has not gone.
  std::vector<PushPart> end_step();

 private:
  struct Leaf {
    std::string name;
    int shard = -1;
    int64_t bytes = 0;
    int64_t expected = -1;  // accumulations per step; -1 until the first step ends
    int64_t seen = 0;
  };
  struct Shard {
    int64_t pending = 0;  // leaves not yet final this step
    std::vector<std::string> ready;
    int64_t ready_bytes = 0;
    bool done = false;
  };

  PushPart take(int shard, bool last);

  int64_t part_bytes_;
  std::map<const AutogradMeta*, size_t> index_;
  std::vector<Leaf> leaves_;  // in model order
  std::vector<Shard> shards_;
  bool learned_ = false;
};

}  // namespace pipit
