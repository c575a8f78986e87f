// The all-reduce (comm/all_reduce.h): on every member, the bits of adding the members' tensors
// one after another in member order, for groups of 1 to 8, tensors of many sizes and segment
// sizes, in f32 and f64; and messages that do not belong are refused by name.
#include <catch2/catch.hpp>
#include <algorithm>
#include <random>
#include <thread>

#include "bitwise.h"
#include "comm/all_reduce.h"
#include "comm/local_communicator.h"
#include "pipit.h"

using namespace pipit;
using pipit::testing::bitwise_equal;

namespace {

// Member i's tensor: values of very different sizes, so the order of the additions shows in
// the bits.
Tensor contribution(int member, int64_t numel, DType dtype, uint64_t seed) {
  Generator generator(seed * 131 + static_cast<uint64_t>(member));
  return (randn({numel}, &generator) * std::pow(10.0, member % 4 - 1)).to(dtype);
}

}  // namespace

TEST_CASE("all_reduce gives every member the in-order sum, bit for bit", "[all_reduce]") {
  uint64_t seed = 0;
  for (int r = 1; r <= 8; ++r) {
    for (const int64_t numel : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      for (const int64_t segment : {int64_t{1}, int64_t{64}, int64_t{1} << 20}) {
        if (numel / segment > 1000) continue;  // thousands of one-element messages: no news
        for (const DType dtype : {DType::f32, DType::f64}) {
          ++seed;
          INFO("r=" << r << " numel " << numel << " segment " << segment << " " << dtype);
          std::vector<Tensor> tensors;
          for (int i = 0; i < r; ++i) tensors.push_back(contribution(i, numel, dtype, seed));
          Tensor expected = tensors[0].clone();
          for (int i = 1; i < r; ++i) expected = expected + tensors[size_t(i)];
          // Members are endpoints 10, 11, ... of one hub, listed in a shuffled id order.
          std::vector<int> members;
          for (int i = 0; i < r; ++i) members.push_back(10 + i);
          std::shuffle(members.begin(), members.end(), std::mt19937(static_cast<unsigned>(seed)));
          auto hub = LocalHub::create();
          std::vector<std::thread> threads;
          std::vector<std::string> errors(static_cast<size_t>(r));
          for (int i = 0; i < r; ++i) {
            threads.emplace_back([&, i] {
              try {
                auto comm = hub->endpoint(members[size_t(i)]);
                all_reduce(*comm, members, tensors[size_t(i)], 5, segment);
              } catch (const std::exception& e) {
                errors[size_t(i)] = e.what();
              }
            });
          }
          for (auto& t : threads) t.join();
          for (int i = 0; i < r; ++i) {
            INFO("member " << i);
            CHECK(errors[size_t(i)].empty());
            CHECK(bitwise_equal(tensors[size_t(i)], expected));
          }
        }
      }
    }
  }
}

TEST_CASE("all_reduce refuses messages that are not its own by name", "[all_reduce]") {
  const Tensor t = zeros({10});
  AllReduce reduce({3, 4, 5}, 4, t, 9, 4);
  Message wrong_sender(MessageKind::AllReduceSegment, 9, 0, 0, {zeros({4})});
  wrong_sender.from = 5;
  CHECK_THROWS_WITH(reduce.receive(wrong_sender), Catch::Contains("came from endpoint 5"));
  Message wrong_shape(MessageKind::AllReduceSegment, 9, 2, 0, {zeros({4})});
  wrong_shape.from = 3;
  CHECK_THROWS_WITH(reduce.receive(wrong_shape), Catch::Contains("shape [2]"));
  Message out_of_range(MessageKind::AllReduceSegment, 9, 3, 0, {zeros({4})});
  out_of_range.from = 3;
  CHECK_THROWS_WITH(reduce.receive(out_of_range), Catch::Contains("unexpected segment 3"));
  Message good(MessageKind::AllReduceSegment, 9, 0, 0, {ones({4})});
  good.from = 3;
  const auto out = reduce.receive(good);
  REQUIRE(out.size() == 1);
  CHECK(out[0].first == 5);
  CHECK_THROWS_WITH(reduce.receive(good), Catch::Contains("unexpected segment 0"));
  CHECK_THROWS_WITH(AllReduce({1, 2}, 3, t, 0), Catch::Contains("not a member"));
}
