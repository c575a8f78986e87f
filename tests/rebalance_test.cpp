#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/partition.h"
#include "pipeline/rebalancing/cost_model.h"
#include "pipeline/rebalancing/rebalance.h"
#include "tensor/error.h"

using namespace pipit;

namespace {

using Ranges = std::vector<LayerRange>;

// A model whose costs are known: what its stages would measure.
struct Planted {
  std::vector<std::string> kinds;
  std::vector<double> work;   // per layer, ms on a speed-1 stage
  std::vector<double> speed;  // per stage
  std::vector<double> output_bytes, state_bytes;

  CostModel model(double link_ms_per_mb) const {
    return CostModel(work, speed, output_bytes, link_ms_per_mb);
  }
  // Every time multiplied by a factor drawn uniformly from [1 - noise, 1 + noise].
  LayerCosts measure(const Ranges& ranges, std::mt19937_64* rng = nullptr, double noise = 0) const {
    LayerCosts costs{{}, output_bytes, state_bytes};
    std::uniform_real_distribution<double> factor(1 - noise, 1 + noise);
    for (size_t c = 0; c < ranges.size(); ++c) {
      for (size_t l = ranges[c].begin; l < ranges[c].end; ++l) {
        costs.ms.push_back(work[l] * speed[c % speed.size()] * (rng ? factor(*rng) : 1.0));
      }
    }
    return costs;
  }
};

// 1 ms of work, 1 MB out and 10 MB of state per layer.
Planted identical_blocks(size_t layers, std::vector<double> speed) {
  return {std::vector<std::string>(layers, "Block(d=512)"), std::vector<double>(layers, 1.0),
          std::move(speed), std::vector<double>(layers, 1e6), std::vector<double>(layers, 1e7)};
}

// An embedding, `blocks` identical blocks and a head, three kinds.
Planted embedding_blocks_head(size_t blocks, double embedding_work, double block_work,
                              double head_work, std::vector<double> speed) {
  Planted planted = identical_blocks(blocks + 2, std::move(speed));
  planted.kinds.front() = "Embedding(50257, 512)";
  planted.kinds.back() = "Linear(512, 50257)";
  planted.work.assign(blocks + 2, block_work);
  planted.work.front() = embedding_work;
  planted.work.back() = head_work;
  for (double& bytes : planted.output_bytes) bytes = 0.5e6;
  planted.state_bytes.front() = planted.state_bytes.back() = 2e8;
  return planted;
}

// Every contiguous partition into one chunk per stage, cut lists in lexicographic order.
std::vector<Ranges> all_partitions(size_t layers, size_t stages) {
  std::vector<size_t> cuts(stages - 1);  // cuts[i]: where chunk i ends
  for (size_t i = 0; i + 1 < stages; ++i) cuts[i] = i + 1;
  std::vector<Ranges> partitions;
  while (true) {
    Ranges& ranges = partitions.emplace_back();
    size_t begin = 0;
    for (size_t cut : cuts) {
      ranges.push_back({begin, cut});
      begin = cut;
    }
    ranges.push_back({begin, layers});
    // The next cut list: raise the last cut that can rise, then pack the ones after it.
    size_t i = cuts.size();
    while (i > 0 && cuts[i - 1] == layers - (cuts.size() - (i - 1))) --i;
    if (i == 0) return partitions;
    ++cuts[i - 1];
    for (size_t j = i; j < cuts.size(); ++j) cuts[j] = cuts[j - 1] + 1;
  }
}

// optimal_partition's definition, by trying every partition: the fastest slowest stage (up
// to 1e-9 relative), then the fewest link bytes to migrate, then the earliest cuts.
Ranges brute_force_optimum(const CostModel& model, const Ranges& current,
                           const std::vector<double>& state_bytes) {
  const std::vector<Ranges> partitions =
      all_partitions(model.layers(), static_cast<size_t>(model.stages()));
  double fastest = INFINITY;
  for (const Ranges& ranges : partitions)
    fastest = std::min(fastest, model.slowest_stage_ms(ranges));
  Ranges best;
  double fewest_bytes = INFINITY;
  for (const Ranges& ranges : partitions) {
    if (model.slowest_stage_ms(ranges) > fastest * (1 + 1e-9)) continue;
    const double bytes =
        estimate_migration(current, ranges, model.stages(), state_bytes, 1.0).link_bytes;
    if (bytes < fewest_bytes) fewest_bytes = bytes, best = ranges;
  }
  return best;
}

// A stage's time written out from the definition in cost_model.h, sum by sum.
double stage_ms_by_definition(const Planted& planted, double link_ms_per_mb, const Ranges& ranges,
                              size_t stage) {
  const size_t p = planted.speed.size(), n = planted.work.size();
  double ms = 0;
  for (size_t c = stage; c < ranges.size(); c += p) {
    for (size_t l = ranges[c].begin; l < ranges[c].end; ++l)
      ms += planted.speed[stage] * planted.work[l];
    if (p == 1) continue;
    if (ranges[c].end < n) ms += planted.output_bytes[ranges[c].end - 1] / 1e6 * link_ms_per_mb;
    if (ranges[c].begin > 0) ms += planted.output_bytes[ranges[c].begin - 1] / 1e6 * link_ms_per_mb;
  }
  return ms;
}

RebalanceConfig enabled_config() {
  RebalanceConfig config;
  config.enabled = true;
  return config;
}

}  // namespace

TEST_CASE("CostModel::fit recovers planted work and stage speeds", "[rebalance]") {
  // Stage 2 is 2.5x slower; stage 0 holds the embedding and stage 3 the head.
  const Planted planted = embedding_blocks_head(24, 3.0, 1.7, 5.5, {1, 1, 2.5, 1});
  const Ranges ranges = stage_layer_ranges(26, 4, 1);
  const CostModel fitted = CostModel::fit(planted.kinds, ranges, 4, planted.measure(ranges), 1.0);
  // Speeds are relative, geometric mean 1: the planted ones over 2.5^(1/4).
  const double geometric_mean = std::pow(2.5, 0.25);
  for (size_t s = 0; s < 4; ++s) {
    CHECK(fitted.stage_speed()[s] == Approx(planted.speed[s] / geometric_mean).epsilon(1e-9));
  }
  for (size_t l = 0; l < 26; ++l) {
    CHECK(fitted.layer_work()[l] == Approx(planted.work[l] * geometric_mean).epsilon(1e-9));
  }
  // So it predicts every partition's stage times as the planted model does.
  const CostModel truth = planted.model(1.0);
  for (const Ranges& other : {ranges, Ranges{{0, 1}, {1, 10}, {10, 13}, {13, 26}}}) {
    for (size_t s = 0; s < 4; ++s) {
      CHECK(fitted.stage_ms(other)[s] == Approx(truth.stage_ms(other)[s]).epsilon(1e-9));
    }
  }
}

TEST_CASE("CostModel::fit gives a stage that shares no kind speed 1", "[rebalance]") {
  // Stage 2 holds only the head, so its 3x cannot be told from the head's work. A layer
  // measured as 0 ms (an identity) adds nothing to the fit and gets work 0.
  const Planted planted{{"Embedding", "Block", "Identity", "Block", "Block", "Head"},
                        {2, 1, 0, 1, 1, 4},
                        {1, 2, 3},
                        std::vector<double>(6, 0),
                        std::vector<double>(6, 0)};
  const Ranges ranges{{0, 3}, {3, 5}, {5, 6}};
  const CostModel fitted = CostModel::fit(planted.kinds, ranges, 3, planted.measure(ranges), 1.0);
  const double root2 = std::sqrt(2.0);
  CHECK(fitted.stage_speed()[0] == Approx(1 / root2).epsilon(1e-9));
  CHECK(fitted.stage_speed()[1] == Approx(root2).epsilon(1e-9));
  CHECK(fitted.stage_speed()[2] == Approx(1.0).epsilon(1e-9));
  const std::vector<double> expected_work{2 * root2, root2, 0, root2, root2, 12};
  for (size_t l = 0; l < 6; ++l) {
    CHECK(fitted.layer_work()[l] == Approx(expected_work[l]).epsilon(1e-9));
  }
}

TEST_CASE("CostModel charges each stage its compute and its sends", "[rebalance]") {
  const CostModel model({1, 2, 3}, {1, 2}, {1e6, 2e6, 5e6}, 2.0);
  // Stage 0: 1 x (1 + 2) + the activation out of layer 1, 2 MB at 2 ms per MB.
  // Stage 1: 2 x 3 + the gradient of that activation sent back, also 2 MB.
  CHECK(model.stage_ms({{0, 2}, {2, 3}}) == std::vector<double>{7, 10});
  CHECK(model.slowest_stage_ms({{0, 2}, {2, 3}}) == 10);
  // One stage sends nothing.
  CHECK(CostModel({1, 2, 3}, {2}, {1e6, 2e6, 5e6}, 2.0).stage_ms({{0, 3}}) ==
        std::vector<double>{12});
}

TEST_CASE("CostModel charges the last stage the loss it waits for", "[rebalance]") {
  // As above, and stage 1 waits 4 ms per microbatch for the coordinator's loss.
  const CostModel model({1, 2, 3}, {1, 2}, {1e6, 2e6, 5e6}, 2.0, 4.0);
  CHECK(model.stage_ms({{0, 2}, {2, 3}}) == std::vector<double>{7, 14});
  CHECK(model.stage_ms({{0, 1}, {1, 3}}) == std::vector<double>{3, 16});
  CHECK(CostModel({1, 2, 3}, {2}, {1e6, 2e6, 5e6}, 2.0, 4.0).stage_ms({{0, 3}}) ==
        std::vector<double>{16});

  // Fitted from measurements that carry it, the loss moves a block off the last stage: with
  // 8 blocks of 1 ms and 1 MB activations, [0, 4) [4, 8) costs 5 and 5 + 2 ms; [0, 5) [5, 8)
  // costs 6 and 6.
  const Planted planted = identical_blocks(8, {1, 1});
  const Ranges halves = stage_layer_ranges(8, 2, 1);
  LayerCosts measured = planted.measure(halves);
  measured.loss_ms = 2;
  const CostModel fitted = CostModel::fit(planted.kinds, halves, 2, measured, 1.0);
  CHECK(fitted.stage_ms(halves) == std::vector<double>{5, 7});
  CHECK(optimal_partition(fitted, halves, planted.state_bytes) == Ranges{{0, 5}, {5, 8}});
  RebalancePolicy policy(enabled_config(), 2, 1, planted.kinds);
  std::optional<Decision> decision;
  for (int64_t step = 1; step <= 8 && !decision; ++step) {
    decision = policy.observe(step, halves, measured, 8);
  }
  REQUIRE(decision);
  CHECK(decision->to == Ranges{{0, 5}, {5, 8}});
  CHECK(decision->new_slowest_ms == Approx(6).epsilon(1e-9));

  measured.loss_ms = -1;
  CHECK_THROWS_WITH(CostModel::fit(planted.kinds, halves, 2, measured, 1.0),
                    Catch::Contains("loss_ms = -1"));

  // Medians per layer and of the loss, over steps.
  LayerCosts slow = planted.measure(halves), fast = slow;
  slow.ms[3] = 9;
  slow.loss_ms = 5;
  fast.ms[3] = 0.5;
  fast.loss_ms = 1;
  const LayerCosts medians = median_layer_costs({slow, fast, planted.measure(halves)});
  CHECK(medians.ms[3] == 1);
  CHECK(medians.ms[4] == 1);
  CHECK(medians.loss_ms == 1);
  fast.ms.pop_back();
  CHECK_THROWS_WITH(median_layer_costs({slow, fast}), Catch::Contains("8 and 7 layers"));
}

TEST_CASE("predict_step_ms and estimate_migration", "[rebalance]") {
  const Planted planted = identical_blocks(24, {1, 2});
  const CostModel model = planted.model(1.0);
  // Stage 1: 12 layers x 2 + 1 MB of gradient = 25 ms; 4 + 2 - 1 stage times per step.
  CHECK(predict_step_ms(model, stage_layer_ranges(24, 2, 1), 4) == 125);
  // Interleaved, v = 2: stage 1 runs [6, 12) and [18, 24): 12 + 2 + 12 + 1 = 27 ms, and the
  // pipeline fills in (p - 1) / v = 0.5 stage times.
  CHECK(predict_step_ms(model, stage_layer_ranges(24, 2, 2), 4) == 4.5 * 27);

  const Migration two_stages = estimate_migration(stage_layer_ranges(24, 2, 1), {{0, 16}, {16, 24}},
                                                  2, planted.state_bytes, 1.0);
  CHECK(two_stages.bytes == 4e7);
  CHECK(two_stages.link_bytes == 4e7);
  CHECK(two_stages.ms == 40);

  // Layers 2 and 3 go from stage 2 to stage 0, relayed through stage 1: two links each.
  const std::vector<double> state{1e6, 1e7, 1e8, 1e9, 1e10, 1e11};
  const Migration relayed =
      estimate_migration({{0, 1}, {1, 2}, {2, 6}}, {{0, 4}, {4, 5}, {5, 6}}, 3, state, 0.5);
  CHECK(relayed.bytes == 1e7 + 1e8 + 1e9 + 1e10);
  CHECK(relayed.link_bytes == 1e7 + 2e8 + 2e9 + 1e10);
  CHECK(relayed.ms == Approx(0.5 * 12210).epsilon(1e-12));
}

TEST_CASE("optimal_partition avoids a large activation, then a costly migration", "[rebalance]") {
  // Cutting after layer 1 sends 10 MB each way: 12 ms. Cutting after layer 0 or 2 sends
  // 0.5 MB: 3.5 ms either way.
  const CostModel model({1, 1, 1, 1}, {1, 1}, {0.5e6, 10e6, 0.5e6, 0.5e6}, 1.0);
  const Ranges halves{{0, 2}, {2, 4}}, early{{0, 1}, {1, 4}}, late{{0, 3}, {3, 4}};
  CHECK(model.slowest_stage_ms(halves) == 12);
  CHECK(model.slowest_stage_ms(early) == 3.5);
  CHECK(model.slowest_stage_ms(late) == 3.5);
  // Moving layer 1 or layer 2 costs the same: the earlier cut.
  CHECK(optimal_partition(model, halves, {0, 0, 0, 0}) == early);
  CHECK(optimal_partition(model, halves, {0, 5e6, 5e6, 0}) == early);
  // Moving layer 2 is cheaper: the later cut.
  CHECK(optimal_partition(model, halves, {0, 5e6, 3e6, 0}) == late);
}

TEST_CASE("optimal_partition matches brute force on random instances", "[rebalance]") {
  std::mt19937_64 rng(20240611);
  auto uniform = [&](double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(rng);
  };
  auto integer = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(rng);
  };
  for (int instance = 0; instance < 2000; ++instance) {
    // Every other instance has small integer work, equal speeds and free links: many ties,
    // which the fewest link bytes, then the earliest cuts, must break.
    const bool ties = instance % 2 == 1;
    const auto p = static_cast<size_t>(integer(1, 4));
    const auto n = static_cast<size_t>(integer(static_cast<int>(p), 10));
    Planted planted;
    for (size_t l = 0; l < n; ++l) {
      planted.work.push_back(ties ? integer(1, 3) : uniform(0.1, 5));
      planted.output_bytes.push_back(ties ? 0 : uniform(0, 4e6));
    }
    for (size_t s = 0; s < p; ++s) planted.speed.push_back(ties ? 1 : uniform(0.5, 3));
    // Whole megabytes of state, so sums of link bytes are exact in any order.
    for (size_t l = 0; l < n; ++l) planted.state_bytes.push_back(integer(0, 3) * 1e6);
    const std::vector<Ranges> partitions = all_partitions(n, p);
    const Ranges current =
        partitions[static_cast<size_t>(integer(0, static_cast<int>(partitions.size()) - 1))];
    const double link = ties ? 0 : uniform(0, 2);
    const CostModel model = planted.model(link);
    INFO("instance " << instance << ": " << n << " layers, " << p << " stages, from "
                     << ranges_str(current));

    const Ranges optimum = optimal_partition(model, current, planted.state_bytes);
    REQUIRE(optimum == brute_force_optimum(model, current, planted.state_bytes));
    REQUIRE(optimal_partition(model, current, planted.state_bytes) == optimum);
    const std::vector<double> ms = model.stage_ms(optimum);
    for (size_t s = 0; s < p; ++s) {
      CHECK(ms[s] == Approx(stage_ms_by_definition(planted, link, optimum, s)).epsilon(1e-12));
    }
  }
}

TEST_CASE("RebalancePolicy moves layers off a 2x slower stage, then holds", "[rebalance]") {
  const Planted planted = identical_blocks(24, {1, 2});
  const RebalanceConfig config = enabled_config();
  RebalancePolicy policy(config, 2, 1, planted.kinds);
  Ranges current = stage_layer_ranges(24, 2, 1);
  const Ranges optimum =
      brute_force_optimum(planted.model(config.link_ms_per_mb), current, planted.state_bytes);
  REQUIRE(optimum == Ranges{{0, 16}, {16, 24}});

  for (int64_t step = 1; step < config.window; ++step) {
    REQUIRE_FALSE(policy.observe(step, current, planted.measure(current), 4));
    CHECK(policy.verdict() ==
          "measuring [0, 12) [12, 24): " + std::to_string(step) + " of 8 steps");
  }
  const std::optional<Decision> decision = policy.observe(8, current, planted.measure(current), 4);
  REQUIRE(decision);
  CHECK(decision->from == current);
  CHECK(decision->to == optimum);
  // Stage 1: 12 x 2 + 1 MB = 25 ms, then 8 x 2 + 1 = 17 (stage 0: 16 + 1).
  CHECK(decision->current_slowest_ms == Approx(25).epsilon(1e-9));
  CHECK(decision->new_slowest_ms == Approx(17).epsilon(1e-9));
  CHECK(decision->gain == Approx(8.0 / 25).epsilon(1e-9));
  CHECK(decision->migration.bytes == 4e7);
  CHECK(decision->migration.ms == Approx(40).epsilon(1e-12));
  // 40 ms of migration against (4 + 2 - 1) x 8 ms saved per step.
  CHECK(decision->payback_steps == Approx(1).epsilon(1e-9));
  CHECK(decision->stage_speed[0] == Approx(1 / std::sqrt(2.0)).epsilon(1e-9));
  CHECK(decision->stage_speed[1] == Approx(std::sqrt(2.0)).epsilon(1e-9));
  CHECK(decision->reason() ==
        "remap [0, 12) [12, 24) -> [0, 16) [16, 24): slowest stage 25.00 -> 17.00 ms per "
        "microbatch (32.0% faster), moves 40.0 MB (40.0 ms), pays back in 1.0 steps; fitted "
        "stage speeds 0.71 1.41");
  CHECK(policy.verdict() == decision->reason());

  policy.remapped(8, decision->to);
  current = decision->to;
  for (int64_t step = 9; step <= 8 + config.cooldown; ++step) {
    REQUIRE_FALSE(policy.observe(step, current, planted.measure(current), 4));
    CHECK(policy.verdict() ==
          "cooling down after the remap at step 8: measuring again from step 19");
  }
  for (int64_t step = 19; step <= 300; ++step) {
    REQUIRE_FALSE(policy.observe(step, current, planted.measure(current), 4));
  }
  CHECK(policy.verdict() ==
        "keeping [0, 16) [16, 24): no partition is predicted faster than its 17.00 ms per "
        "microbatch");
}

TEST_CASE("RebalancePolicy unloads the stage holding a heavy head", "[rebalance]") {
  // Embedding 6 ms, 12 blocks of 1 ms, head 8 ms, 0.5 MB activations, equal stages.
  const Planted planted = embedding_blocks_head(12, 6, 1, 8, {1, 1, 1, 1});
  RebalancePolicy policy(enabled_config(), 4, 1, planted.kinds);
  Ranges current = stage_layer_ranges(14, 4, 1);  // stage 3: 2 blocks + head + 0.5 MB = 10.5
  std::optional<Decision> decision;
  for (int64_t step = 1; step <= 8 && !decision; ++step) {
    decision = policy.observe(step, current, planted.measure(current), 8);
  }
  REQUIRE(decision);
  // The head alone takes 8.5 ms with its gradient send, so does the embedding with two
  // blocks; moving the fewest layers, 3, 11 and 12, one stage each, keeps every stage within.
  const Ranges expected{{0, 3}, {3, 8}, {8, 13}, {13, 14}};
  CHECK(brute_force_optimum(planted.model(1.0), stage_layer_ranges(14, 4, 1),
                            planted.state_bytes) == expected);
  CHECK(decision->to == expected);
  CHECK(decision->current_slowest_ms == Approx(10.5).epsilon(1e-9));
  CHECK(decision->new_slowest_ms == Approx(8.5).epsilon(1e-9));
  for (double speed : decision->stage_speed) CHECK(speed == Approx(1).epsilon(1e-9));

  policy.remapped(8, decision->to);
  current = decision->to;
  for (int64_t step = 9; step <= 200; ++step) {
    REQUIRE_FALSE(policy.observe(step, current, planted.measure(current), 8));
  }
}

TEST_CASE("RebalancePolicy does not chase 15% noise", "[rebalance]") {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng(seed);
    INFO("seed " << seed);
    // Balanced: equal stages, equal halves; and the heavy-ends model at its optimum.
    const Planted even = identical_blocks(24, {1, 1});
    const Planted ends = embedding_blocks_head(12, 6, 1, 8, {1, 1, 1, 1});
    RebalancePolicy even_policy(enabled_config(), 2, 1, even.kinds);
    RebalancePolicy ends_policy(enabled_config(), 4, 1, ends.kinds);
    const Ranges even_ranges = stage_layer_ranges(24, 2, 1);
    const Ranges ends_ranges{{0, 3}, {3, 8}, {8, 13}, {13, 14}};
    for (int64_t step = 1; step <= 500; ++step) {
      REQUIRE_FALSE(
          even_policy.observe(step, even_ranges, even.measure(even_ranges, &rng, 0.15), 4));
      REQUIRE_FALSE(
          ends_policy.observe(step, ends_ranges, ends.measure(ends_ranges, &rng, 0.15), 4));
    }

    // Stage 1 2x slower: one remap, to 16/8, then none.
    const Planted slowed = identical_blocks(24, {1, 2});
    RebalancePolicy policy(enabled_config(), 2, 1, slowed.kinds);
    Ranges current = stage_layer_ranges(24, 2, 1);
    int remaps = 0;
    for (int64_t step = 1; step <= 500; ++step) {
      const std::optional<Decision> decision =
          policy.observe(step, current, slowed.measure(current, &rng, 0.15), 4);
      if (!decision) continue;
      ++remaps;
      current = decision->to;
      policy.remapped(step, current);
    }
    CHECK(remaps == 1);
    CHECK(current == Ranges{{0, 16}, {16, 24}});
  }
}

TEST_CASE("RebalancePolicy needs the gain in 7 of the window's 8 steps", "[rebalance]") {
  // Steps 3 and 6 find both stages equally fast. The medians still see stage 1 2x slower,
  // but only 6 of the steps do until step 3 leaves the window, at step 11.
  const Planted slowed = identical_blocks(24, {1, 2}), even = identical_blocks(24, {1, 1});
  RebalancePolicy policy(enabled_config(), 2, 1, slowed.kinds);
  const Ranges current = stage_layer_ranges(24, 2, 1);
  for (int64_t step = 1; step <= 10; ++step) {
    const Planted& measured = step == 3 || step == 6 ? even : slowed;
    REQUIRE_FALSE(policy.observe(step, current, measured.measure(current), 4));
  }
  CHECK(policy.verdict() ==
        "keeping [0, 12) [12, 24): the best partition [0, 16) [16, 24) gains 32.0% on the "
        "window's medians, but more than 10.0% in only 6 of its 8 steps alone (7 needed)");
  const std::optional<Decision> decision = policy.observe(11, current, slowed.measure(current), 4);
  REQUIRE(decision);
  CHECK(decision->to == Ranges{{0, 16}, {16, 24}});
}

TEST_CASE("RebalancePolicy declines a migration that does not pay back", "[rebalance]") {
  // Stage 1 1.5x slower: 14/10 cuts the slowest stage from 19 to 16 ms, 15.8%, saving
  // (4 + 2 - 1) x 3 = 15 ms per step, by moving layers 12 and 13.
  Planted planted = identical_blocks(24, {1, 1.5});
  const Ranges current = stage_layer_ranges(24, 2, 1);
  for (double& bytes : planted.state_bytes) bytes = 1e9;  // 2000 MB, 2000 ms: 133 steps
  RebalancePolicy policy(enabled_config(), 2, 1, planted.kinds);
  for (int64_t step = 1; step <= 50; ++step) {
    REQUIRE_FALSE(policy.observe(step, current, planted.measure(current), 4));
  }
  CHECK_THAT(policy.verdict(),
             Catch::StartsWith("declined, pays back in 133.3 steps, more than 50: remap [0, 12) "
                               "[12, 24) -> [0, 14) [14, 24): slowest stage 19.00 -> 16.00 ms"));

  RebalanceConfig patient = enabled_config();
  patient.payback_steps = 200;
  RebalancePolicy patient_policy(patient, 2, 1, planted.kinds);
  std::optional<Decision> decision;
  for (int64_t step = 1; step <= 8; ++step) {
    decision = patient_policy.observe(step, current, planted.measure(current), 4);
  }
  REQUIRE(decision);
  CHECK(decision->to == Ranges{{0, 14}, {14, 24}});
  CHECK(decision->payback_steps == Approx(2000.0 / 15).epsilon(1e-9));
}

TEST_CASE("RebalancePolicy needs twice the threshold to undo its last remap", "[rebalance]") {
  // Three equal layers on two stages: A = 1 | 2 layers, B = 2 | 1.
  const Ranges a{{0, 1}, {1, 3}}, b{{0, 2}, {2, 3}};
  Planted planted{std::vector<std::string>(3, "Block"), {1, 1, 1}, {1, 3}, {0, 0, 0}, {0, 0, 0}};
  RebalancePolicy policy(enabled_config(), 2, 1, planted.kinds);
  std::optional<Decision> decision;
  for (int64_t step = 1; step <= 8; ++step)
    decision = policy.observe(step, a, planted.measure(a), 4);
  REQUIRE(decision);  // 6 ms -> 3 ms
  REQUIRE(decision->to == b);
  policy.remapped(8, b);

  // Stage 0 now 1.2x: A would take 2 ms instead of 2.4, 16.7%, above 10% but not 20%.
  planted.speed = {1.2, 1};
  for (int64_t step = 9; step <= 60; ++step) {
    REQUIRE_FALSE(policy.observe(step, b, planted.measure(b), 4));
  }
  CHECK(policy.verdict() ==
        "keeping [0, 2) [2, 3): the best partition [0, 1) [1, 3) gains 16.7%, not more than "
        "20.0% (twice the threshold, to undo the last remap)");

  // Stage 0 now 1.5x: 3 ms -> 2, 33.3%.
  planted.speed = {1.5, 1};
  decision.reset();
  for (int64_t step = 61; step <= 68 && !decision; ++step) {
    decision = policy.observe(step, b, planted.measure(b), 4);
  }
  REQUIRE(decision);
  CHECK(decision->to == a);
}

TEST_CASE("Rebalancing rejects inconsistent inputs, naming them", "[rebalance]") {
  const Planted planted = identical_blocks(24, {1, 1});
  const Ranges halves = stage_layer_ranges(24, 2, 1);
  const std::vector<std::string> five(5, "Block");

  CHECK_THROWS_WITH(RebalancePolicy(enabled_config(), 4, 2, five),
                    Catch::Contains("8 chunks") && Catch::Contains("only 5 layers"));
  CHECK_THROWS_WITH(RebalancePolicy(enabled_config(), 2, 2, planted.kinds),
                    Catch::Contains("supports v = 1") && Catch::Contains("v = 2") &&
                        Catch::Contains("manual remaps"));
  RebalanceConfig no_window = enabled_config();
  no_window.window = 0;
  CHECK_THROWS_WITH(RebalancePolicy(no_window, 2, 1, planted.kinds),
                    Catch::Contains("window must be >= 1 step, got 0"));
  // Disabled, v > 1 is fine and nothing is judged.
  RebalancePolicy disabled(RebalanceConfig{}, 2, 2, planted.kinds);
  CHECK_FALSE(disabled.observe(1, stage_layer_ranges(24, 2, 2), planted.measure(halves), 4));
  CHECK(disabled.verdict() == "automatic rebalancing is disabled");

  RebalancePolicy policy(enabled_config(), 2, 1, planted.kinds);
  LayerCosts short_ms = planted.measure(halves);
  short_ms.ms.pop_back();
  CHECK_THROWS_WITH(policy.observe(1, halves, short_ms, 4),
                    Catch::Contains("ms has 23 entries for 24 layers"));
  LayerCosts negative = planted.measure(halves);
  negative.ms[3] = -1;
  CHECK_THROWS_WITH(policy.observe(1, halves, negative, 4),
                    Catch::Contains("ms[3] = -1") && Catch::Contains(">= 0"));
  LayerCosts not_a_number = planted.measure(halves);
  not_a_number.state_bytes[5] = NAN;
  CHECK_THROWS_WITH(policy.observe(1, halves, not_a_number, 4),
                    Catch::Contains("state_bytes[5] = nan"));
  const LayerCosts costs = planted.measure(halves);
  CHECK_THROWS_WITH(policy.observe(1, {{0, 24}, {24, 24}}, costs, 4),
                    Catch::Contains("chunk 1 [24, 24) is empty"));
  CHECK_THROWS_WITH(policy.observe(1, {{0, 10}, {11, 24}}, costs, 4),
                    Catch::Contains("chunk 1 starts at layer 11 instead of 10"));
  CHECK_THROWS_WITH(policy.observe(1, {{0, 10}, {10, 20}}, costs, 4),
                    Catch::Contains("cover layers [0, 20), but the model has 24 layers"));
  CHECK_THROWS_WITH(policy.observe(1, {{0, 8}, {8, 16}, {16, 24}}, costs, 4),
                    Catch::Contains("3 ranges given for 2 chunks"));
  CHECK_THROWS_WITH(policy.observe(1, halves, costs, 0),
                    Catch::Contains("microbatches must be >= 1, got 0"));
  policy.observe(5, halves, costs, 4);
  CHECK_THROWS_WITH(policy.observe(5, halves, costs, 4),
                    Catch::Contains("step 5 does not come after step 5"));
  CHECK_THROWS_WITH(policy.remapped(4, halves), Catch::Contains("step 4 comes before step 5"));

  CHECK_THROWS_WITH(CostModel::fit(five, halves, 2, costs, 1.0),
                    Catch::Contains("cover layers [0, 24), but the model has 5 layers"));
  CHECK_THROWS_WITH(CostModel({1, 1}, {1, 0}, {0, 0}, 1.0), Catch::Contains("stage_speed[1] = 0"));
  CHECK_THROWS_WITH(optimal_partition(CostModel({1, 1}, {1, 1, 1}, {0, 0}, 1.0), {}, {0, 0}),
                    Catch::Contains("3 stages need at least 3 layers, but the model has 2"));
}
