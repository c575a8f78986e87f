#include <catch2/catch.hpp>

#include "nn/builders.h"
#include "nn/layers.h"
#include "pipeline/partition.h"
#include "tensor/error.h"

using namespace pipit;

namespace {

std::vector<size_t> sizes(const std::vector<LayerRange>& ranges) {
  std::vector<size_t> out;
  for (const LayerRange& range : ranges) out.push_back(range.end - range.begin);
  return out;
}

}  // namespace

TEST_CASE("stage_layer_ranges splits layers evenly, remainder first", "[pipeline]") {
  std::vector<LayerRange> ranges = stage_layer_ranges(24, 4, 2);
  REQUIRE(ranges.size() == 8);
  for (size_t c = 0; c < 8; ++c) CHECK(ranges[c] == LayerRange{3 * c, 3 * c + 3});
  // Stage 0 holds chunks 0 and 4: layers 0-2 and 12-14.
  CHECK(ranges[0] == LayerRange{0, 3});
  CHECK(ranges[4] == LayerRange{12, 15});

  CHECK(stage_layer_ranges(10, 3, 1) == std::vector<LayerRange>{{0, 4}, {4, 7}, {7, 10}});
  CHECK(sizes(stage_layer_ranges(11, 2, 2)) == std::vector<size_t>{3, 3, 3, 2});
  CHECK(stage_layer_ranges(4, 4, 1) == std::vector<LayerRange>{{0, 1}, {1, 2}, {2, 3}, {3, 4}});

  CHECK_THROWS_WITH(stage_layer_ranges(5, 3, 2), Catch::Contains("stage_layer_ranges") &&
                                                     Catch::Contains("6 chunks") &&
                                                     Catch::Contains("only 5 layers"));
  CHECK_THROWS_WITH(stage_layer_ranges(5, 0, 1), Catch::Contains("p = 0"));
  CHECK_THROWS_WITH(stage_layer_ranges(5, 1, 0), Catch::Contains("v = 0"));
}

TEST_CASE("partition_by_parameters minimises the largest chunk", "[pipeline]") {
  // Linear(4, 100) 500, ReLU 1, Linear(100, 100) 10100, ReLU 1, Linear(100, 2) 202.
  auto model = mlp({4, 100, 100, 2});
  REQUIRE(model->size() == 5);
  // Cuts at 1, 2, 3, 4 give maxima 10304, 10303, 10601, 10602: the best is after the ReLU.
  CHECK(partition_by_parameters(*model, 2, 1) == std::vector<LayerRange>{{0, 2}, {2, 5}});
  // Three chunks: the big Linear alone bounds the maximum at 10100; the earliest cuts that
  // achieve it are [0, 2) (501) and [2, 3).
  CHECK(partition_by_parameters(*model, 3, 1) == std::vector<LayerRange>{{0, 2}, {2, 3}, {3, 5}});
  // One layer per chunk when p * v equals the layer count.
  CHECK(partition_by_parameters(*model, 5, 1) == stage_layer_ranges(5, 5, 1));
  CHECK(partition_by_parameters(*model, 1, 1) == std::vector<LayerRange>{{0, 5}});
  CHECK_THROWS_WITH(partition_by_parameters(*model, 3, 2),
                    Catch::Contains("partition_by_parameters") && Catch::Contains("only 5 layers"));
}

TEST_CASE("partition_by_parameters breaks ties toward earlier cuts", "[pipeline]") {
  // Five parameter-free layers weigh one each: the maximum is 3 either way, and the earliest
  // cut wins (stage_layer_ranges would give [0, 3), [3, 5)).
  Sequential relus;
  for (int i = 0; i < 5; ++i) relus.push_back(std::make_shared<ReLU>());
  CHECK(partition_by_parameters(relus, 2, 1) == std::vector<LayerRange>{{0, 2}, {2, 5}});
  CHECK(partition_by_parameters(relus, 3, 1) == std::vector<LayerRange>{{0, 1}, {1, 3}, {3, 5}});
}

TEST_CASE("partition_by_parameters balances a gpt's blocks", "[pipeline]") {
  // Layers: embedding 13*16 + 8*16 = 336, four blocks of 3280, LayerNorm 32, head 16*13 + 13.
  auto model = gpt({13, 8, 4, 2, 16, 0.0});
  REQUIRE(model->size() == 7);
  CHECK((*model)[0]->parameter_count() == 336);
  CHECK((*model)[1]->parameter_count() == 3280);
  CHECK((*model)[6]->parameter_count() == 221);
  // p = 2: any other cut leaves three blocks on one side; cutting after block 2 gives
  // 336 + 2 * 3280 = 6896 against 2 * 3280 + 32 + 221 = 6813.
  CHECK(partition_by_parameters(*model, 2, 1) == std::vector<LayerRange>{{0, 3}, {3, 7}});
  // p = 2, v = 2: one block per chunk bounds the maximum by embedding + block = 3616, and
  // the last block takes LayerNorm and head with it (3280 + 32 + 221 = 3533).
  CHECK(partition_by_parameters(*model, 2, 2) ==
        std::vector<LayerRange>{{0, 2}, {2, 3}, {3, 4}, {4, 7}});
}
