#include "batching/planner.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace pipit::batching {
namespace {

using Clock = std::chrono::steady_clock;

// The pending nodes from s.planned_from on, with what the scheduler tracks about them.
struct Pending {
  size_t base = 0;
  std::vector<int32_t> nodes;               // in index order
  std::vector<char> needed;                 // by node - base
  std::vector<int32_t> missing;             // inputs not yet run, by node - base
  std::vector<int32_t> offsets, consumers;  // CSR: who takes each node's outputs

  size_t local(int32_t node) const { return static_cast<size_t>(node) - base; }
  bool pending(int32_t node) const {
    return static_cast<size_t>(node) >= base && needed[local(node)];
  }
};

template <typename F>
void for_each_input(const GraphState& s, int32_t node, F f) {
  const BatchNode& n = s.nodes[static_cast<size_t>(node)];
  for (int32_t i = 0; i < n.input_count; ++i)
    f(s.inputs[static_cast<size_t>(n.first_input + i)].node);
}

Pending find_pending(const GraphState& s) {
  Pending p;
  p.base = static_cast<size_t>(s.planned_from);
  const size_t n = s.nodes.size() - p.base;
  p.needed.assign(n, 0);
  std::vector<int32_t> stack;
  for (size_t i = p.base; i < s.nodes.size(); ++i) {
    if (s.nodes[i].handles > 0 && s.nodes[i].batch < 0) {
      p.needed[i - p.base] = 1;
      stack.push_back(static_cast<int32_t>(i));
    }
  }
  while (!stack.empty()) {
    const int32_t node = stack.back();
    stack.pop_back();
    for_each_input(s, node, [&](int32_t input) {
      if (static_cast<size_t>(input) >= p.base && s.nodes[static_cast<size_t>(input)].batch < 0 &&
          !p.needed[p.local(input)]) {
        p.needed[p.local(input)] = 1;
        stack.push_back(input);
      }
    });
  }
  for (size_t i = p.base; i < s.nodes.size(); ++i) {
    if (p.needed[i - p.base]) p.nodes.push_back(static_cast<int32_t>(i));
  }
  p.missing.assign(n, 0);
  p.offsets.assign(n + 1, 0);
  for (int32_t node : p.nodes) {
    for_each_input(s, node, [&](int32_t input) {
      if (!p.pending(input)) return;
      ++p.missing[p.local(node)];
      ++p.offsets[p.local(input) + 1];
    });
  }
  for (size_t i = 0; i < n; ++i) p.offsets[i + 1] += p.offsets[i];
  p.consumers.resize(static_cast<size_t>(p.offsets[n]));
  std::vector<int32_t> fill(p.offsets.begin(), p.offsets.end() - 1);
  for (int32_t node : p.nodes) {
    for_each_input(s, node, [&](int32_t input) {
      if (p.pending(input)) p.consumers[static_cast<size_t>(fill[p.local(input)]++)] = node;
    });
  }
  return p;
}

struct Runner {
  GraphState& s;
  GraphStats& stats;
  std::vector<std::vector<int32_t>>& log;
  double executing = 0;

  void run(std::vector<int32_t> batch) {
    const auto start = Clock::now();
    execute_batch(s, batch, stats);
    executing += std::chrono::duration<double>(Clock::now() - start).count();
    log.push_back(std::move(batch));
  }
};

// DyNet's agenda: of the keys with ready nodes, run the one whose ready nodes have the
// smallest mean depth; the nodes it makes ready join the agenda for the next pick.
void run_agenda(Pending& p, Runner& runner) {
  GraphState& s = runner.s;
  std::vector<std::vector<int32_t>> ready;  // by key
  std::vector<int64_t> depth_sum;
  auto make_ready = [&](int32_t node) {
    BatchNode& n = s.nodes[static_cast<size_t>(node)];
    n.key = s.key_of(node);
    const size_t key = static_cast<size_t>(n.key);
    if (key >= ready.size()) {
      ready.resize(key + 1);
      depth_sum.resize(key + 1, 0);
    }
    ready[key].push_back(node);
    depth_sum[key] += n.depth;
  };
  for (int32_t node : p.nodes) {
    if (p.missing[p.local(node)] == 0) make_ready(node);
  }
  while (true) {
    size_t best = ready.size();
    for (size_t k = 0; k < ready.size(); ++k) {
      if (ready[k].empty()) continue;
      // Mean depths compared without dividing: a/x < b/y <=> a*y < b*x.
      if (best == ready.size() || depth_sum[k] * static_cast<int64_t>(ready[best].size()) <
                                      depth_sum[best] * static_cast<int64_t>(ready[k].size())) {
        best = k;
      }
    }
    if (best == ready.size()) return;
    std::vector<int32_t> batch = std::move(ready[best]);
    ready[best].clear();
    depth_sum[best] = 0;
    runner.run(batch);
    for (int32_t node : runner.log.back()) {
      for (int32_t c = p.offsets[p.local(node)]; c < p.offsets[p.local(node) + 1]; ++c) {
        const int32_t consumer = p.consumers[static_cast<size_t>(c)];
        if (--p.missing[p.local(consumer)] == 0) make_ready(consumer);
      }
    }
  }
}

// Depth by depth; within one depth (whose inputs all lie deeper down, so have run), a batch
// per key, in the order the keys were first seen.
void run_by_depth(Pending& p, Runner& runner) {
  GraphState& s = runner.s;
  std::map<int32_t, std::vector<int32_t>> by_depth;
  for (int32_t node : p.nodes) by_depth[s.nodes[static_cast<size_t>(node)].depth].push_back(node);
  for (auto& [depth, nodes] : by_depth) {
    std::vector<int32_t> keys;
    std::vector<std::vector<int32_t>> batches;
    for (int32_t node : nodes) {
      const int32_t key = s.nodes[static_cast<size_t>(node)].key = s.key_of(node);
      const size_t slot =
          static_cast<size_t>(std::find(keys.begin(), keys.end(), key) - keys.begin());
      if (slot == keys.size()) {
        keys.push_back(key);
        batches.emplace_back();
      }
      batches[slot].push_back(node);
    }
    for (auto& batch : batches) runner.run(std::move(batch));
  }
}

}  // namespace

void run_batches(GraphState& state, Strategy strategy, GraphStats& stats,
                 std::vector<std::vector<int32_t>>& batches) {
  const auto start = Clock::now();
  Pending pending = find_pending(state);
  Runner runner{state, stats, batches};
  if (strategy == Strategy::depth) {
    run_by_depth(pending, runner);
  } else {
    run_agenda(pending, runner);
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  stats.run_seconds += runner.executing;
  stats.plan_seconds += total - runner.executing;
}

}  // namespace pipit::batching
