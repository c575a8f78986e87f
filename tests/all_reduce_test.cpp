// The all-reduce (comm/all_reduce.h): on every member, the bits of adding the members' tensors
// one after another in member order, for groups of 1 to 8, tensors of many sizes and segment
// sizes, in f32 and f64; and messages that do not belong are refused by name.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <thread>

#include "bitwise.h"
#include "comm/all_reduce.h"
#include "comm/local_communicator.h"
#include "pipit.h"
#include "tensor/backend.h"

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

TEST_CASE("an all-reduce started before its tensors are final waits for them, with the same bits",
          "[all_reduce]") {
  std::mt19937_64 random(41);
  for (int r = 2; r <= 6; ++r) {
    for (const int64_t segment : {int64_t{1}, int64_t{16}, int64_t{100}}) {
      const int64_t numel = 257;
      INFO("r=" << r << " segment " << segment);
      std::vector<Tensor> finals, tensors;
      for (int i = 0; i < r; ++i) {
        finals.push_back(contribution(i, numel, DType::f32, 7 + static_cast<uint64_t>(r)));
        // Not final yet: what a member sums before make_ready covers it would show as NaN.
        tensors.push_back(full({numel}, std::nan("")));
      }
      Tensor expected = finals[0].clone();
      for (int i = 1; i < r; ++i) expected = expected + finals[size_t(i)];
      std::vector<int> members;
      for (int i = 0; i < r; ++i) members.push_back(i);
      std::vector<AllReduce> reduces;
      std::vector<int64_t> ready(static_cast<size_t>(r), 0);
      std::vector<std::pair<int, Message>> in_flight;  // (to, message)
      auto post = [&](AllReduce::Outgoing out, int from) {
        for (auto& [to, message] : out) {
          message.from = from;
          in_flight.emplace_back(to, std::move(message));
        }
      };
      for (int i = 0; i < r; ++i) {
        reduces.emplace_back(members, i, tensors[size_t(i)], 3, segment, 0);
        post(reduces.back().start(), i);
      }
      // Members reveal their tensors in random steps while messages arrive in random order.
      while (!in_flight.empty() || *std::min_element(ready.begin(), ready.end()) < numel) {
        const int i = static_cast<int>(random() % static_cast<uint64_t>(r));
        if (ready[size_t(i)] < numel && (in_flight.empty() || random() % 2 == 0)) {
          const int64_t next = std::min(numel, ready[size_t(i)] + 1 + int64_t(random() % 60));
          const Tensor target =
              narrow(tensors[size_t(i)], 0, ready[size_t(i)], next - ready[size_t(i)]);
          backend(target).copy(
              narrow(finals[size_t(i)], 0, ready[size_t(i)], next - ready[size_t(i)]), target);
          ready[size_t(i)] = next;
          post(reduces[size_t(i)].make_ready(next), i);
        } else if (!in_flight.empty()) {
          const size_t k = random() % in_flight.size();
          auto [to, message] = std::move(in_flight[k]);
          in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(k));
          post(reduces[size_t(to)].receive(message), to);
        }
      }
      for (int i = 0; i < r; ++i) {
        INFO("member " << i);
        CHECK(reduces[size_t(i)].done());
        CHECK(bitwise_equal(tensors[size_t(i)], expected));
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
