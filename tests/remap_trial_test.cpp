// RemapTrial: an automatic remap is judged on measured step times after its cooldown.
#include <catch2/catch.hpp>

#include "pipeline/rebalancing/remap_trial.h"

using namespace pipit;

TEST_CASE("a remap whose steps got slower is undone, one that paid is kept", "[rebalance]") {
  const std::vector<LayerRange> before = {{0, 12}, {12, 24}};
  // Remapped after step 10, cooldown 2, window 3, threshold 10%: steps 11 and 12 are not
  // judged, steps 13-15 are.
  RemapTrial slower(before, 100.0, 10, 2, 3, 0.10);
  CHECK_FALSE(slower.record(11, 500.0));
  CHECK_FALSE(slower.record(12, 500.0));
  CHECK_FALSE(slower.record(13, 112.0));
  CHECK_FALSE(slower.record(14, 90.0));
  const std::optional<bool> verdict = slower.record(15, 115.0);
  REQUIRE(verdict);
  CHECK(*verdict);  // median 112 > 110
  CHECK(slower.before() == before);
  CHECK(slower.summary() == "steps took 100.0 ms before the remap and 112.0 ms after");

  RemapTrial faster(before, 100.0, 10, 2, 3, 0.10);
  for (int64_t step = 11; step <= 14; ++step) CHECK_FALSE(faster.record(step, 70.0));
  const std::optional<bool> kept = faster.record(15, 109.0);
  REQUIRE(kept);
  CHECK_FALSE(*kept);  // median 70

  // Within the threshold counts as no worse: noise must not undo a remap.
  RemapTrial level(before, 100.0, 0, 0, 1, 0.10);
  CHECK(level.record(1, 109.9) == std::optional<bool>(false));
}

TEST_CASE("medians and bad trial settings", "[rebalance]") {
  CHECK(median_of({}) == 0);
  CHECK(median_of({3, 1, 2}) == 2);
  CHECK(median_of({4, 1, 3, 2}) == 3);
  CHECK_THROWS_WITH(RemapTrial({{0, 1}}, 10, 0, 0, 0, 0.1), Catch::Contains("window 0"));
}
