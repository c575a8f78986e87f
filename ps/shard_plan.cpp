#include "ps/shard_plan.h"

#include <algorithm>
#include <numeric>

namespace pipit {

std::vector<int> plan_shards(const NamedParameters& parameters, int servers) {
  PIPIT_CHECK(servers >= 1, "plan_shards: servers must be >= 1, got ", servers);
  PIPIT_CHECK(static_cast<int64_t>(parameters.size()) >= servers, "plan_shards: ", servers,
              " server shards for ", parameters.size(),
              " parameter tensors would leave a shard empty");
  std::vector<size_t> order(parameters.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return parameters[a].second.nbytes() > parameters[b].second.nbytes();
  });
  std::vector<size_t> load(servers, 0);
  std::vector<int> shard_of(parameters.size());
  for (size_t i : order) {
    const int lightest =
        static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    shard_of[i] = lightest;
    load[lightest] += parameters[i].second.nbytes();
  }
  return shard_of;
}

NamedParameters shard_parameters(const NamedParameters& parameters,
                                 const std::vector<int>& shard_of, int shard) {
  NamedParameters own;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (shard_of[i] == shard) own.push_back(parameters[i]);
  }
  return own;
}

}  // namespace pipit
