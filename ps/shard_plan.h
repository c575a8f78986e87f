#pragma once
// How parameters split over k server shards: by whole tensors, balanced by bytes. Largest
// tensors first, each to the shard holding the fewest bytes so far (lowest index on ties),
// which keeps every shard within the largest tensor of the mean; each shard keeps the
// model's order. Every side computes the same plan from the same model.
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace pipit {

// shard_of[i]: the shard of parameters[i]. Throws when there are fewer tensors than shards.
std::vector<int> plan_shards(const NamedParameters& parameters, int servers);

// The parameters of `shard`, in model order.
NamedParameters shard_parameters(const NamedParameters& parameters,
                                 const std::vector<int>& shard_of, int shard);

}  // namespace pipit
