// cuda::Graph: a GPT's forward and backward captured once and replayed on new batches, against
// the same steps run eagerly; what a capture refuses; index faults inside replays; the
// capture's memory kept from other work. Without a CUDA device each test reports "skipped".
#include <catch2/catch.hpp>
#include <vector>

#include "bitwise.h"
#include "cuda_testing.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/cuda_graph.h"
#endif

using namespace pipit;
using Catch::Matchers::Contains;
using namespace testing::cuda_testing;
using testing::bitwise_equal;

#ifdef PIPIT_WITH_CUDA
namespace {

constexpr int64_t kVocab = 17, kContext = 16, kRows = 4;

// Batch k of a step sequence: every step sees other tokens, so a replay that kept the
// capture's inputs (or reused its results) shows in the losses.
std::pair<Tensor, Tensor> batch(int k) {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < kRows * kContext; ++i) {
    x.push_back((i * 7 + k * 5) % kVocab);
    y.push_back((i * 3 + k * 11 + 1) % kVocab);
  }
  return {from_vector(x, {kRows, kContext}), from_vector(y, {kRows, kContext})};
}

struct Run {
  std::vector<float> losses;
  StateDict weights;
};

GptConfig config(bool tied) {
  GptConfig c{kVocab, kContext, 2, 2, 32, 0.0};
  c.tie_embeddings = tied;
  return c;
}

// `steps` AdamW steps of a seeded GPT on the GPU under `dtype` autocast; with `graph`, the
// first runs eagerly and the rest replay a capture of the forward and backward.
Run train(DType dtype, bool tied, int steps, bool graph) {
  Generator g(21);
  auto model = gpt(config(tied), &g);
  model->to(kCuda);
  AdamW optimizer(model->named_parameters(), {.lr = 0.01, .weight_decay = 0.1});
  Tensor x = batch(0).first.to(kCuda), y = batch(0).second.to(kCuda);
  Tensor loss;
  auto forward_backward = [&] {
    AutocastGuard autocast(dtype);
    loss = cross_entropy(model->forward(x), y);
    loss.backward();
  };
  auto load = [&](int k) {
    const auto [host_x, host_y] = batch(k);
    backend(x).copy(host_x, x);
    backend(y).copy(host_y, y);
  };
  Run run;
  std::unique_ptr<cuda::Graph> captured;
  for (int k = 0; k < steps; ++k) {
    load(k);
    if (graph && k == 1) {
      optimizer.zero_grad();
      captured = std::make_unique<cuda::Graph>(kCuda);
      captured->capture(forward_backward);
    }
    if (captured) {
      captured->replay();
    } else {
      optimizer.zero_grad();
      forward_backward();
    }
    optimizer.step();
    run.losses.push_back(loss.item<float>());
  }
  run.weights = model->state_dict();
  return run;
}

}  // namespace
#endif

TEST_CASE("cuda: a captured GPT step replayed on new batches matches eager steps bit for bit",
          "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  for (const auto& [dtype, tied] : {std::pair{DType::f32, false}, std::pair{DType::bf16, true}}) {
    INFO(dtype << (tied ? ", tied head" : ""));
    const Run eager = train(dtype, tied, 5, false);
    const Run replayed = train(dtype, tied, 5, true);
    // Different batches give different losses: equal losses below are not a constant.
    CHECK(eager.losses[1] != eager.losses[2]);
    CHECK(replayed.losses == eager.losses);
    testing::check_bitwise_equal(replayed.weights, eager.weights);
  }
#endif
}

TEST_CASE("cuda: a capture refuses host copies, read-backs and random draws", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(4);
  const Tensor host = testing::random({64}, DType::f32, g);
  const Tensor x = host.to(kCuda);
  const std::vector<std::pair<std::function<void()>, std::string>> refused = {
      {[&] { (void)host.to(kCuda); }, "host-to-device"},
      {[&] { (void)sum(x * 2.0).item<float>(); }, "device-to-host"},
      {[&] { (void)dropout(x, 0.5, true, &g); }, "random draws"},
  };
  for (const auto& [work, what] : refused) {
    INFO(what);
    cuda::Graph graph(kCuda);
    REQUIRE_THROWS_WITH(graph.capture(work), Contains("cuda::Graph::capture") && Contains(what));
    CHECK_FALSE(graph.captured());
    CHECK_FALSE(cuda::capturing());
    REQUIRE_THROWS_WITH(graph.replay(), Contains("nothing captured"));
    // The failed capture ended: eager work runs, and the same Graph captures what it may.
    CHECK(bitwise_equal((x + 1.0).to(kCpu), host + 1.0));
    Tensor doubled;
    graph.capture([&] { doubled = x * 2.0; });
    graph.replay();
    CHECK(bitwise_equal(doubled.to(kCpu), host * 2.0));
  }
#endif
}

TEST_CASE("cuda: an index out of range inside a replay surfaces at synchronize", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(9);
  const Tensor table = testing::random({kVocab, 8}, DType::f32, g).to(kCuda);
  Tensor ids = batch(0).first.to(kCuda), rows;
  rows = embedding(table, ids);
  synchronize(kCuda);
  cuda::Graph graph(kCuda);
  graph.capture([&] { rows = embedding(table, ids); });
  for (int round = 0; round < 2; ++round) {
    // A good replay, then one whose ids were overwritten with a row the table lacks.
    graph.replay();
    REQUIRE_NOTHROW(synchronize(kCuda));
    std::vector<int64_t> bad = batch(1).first.to_vector<int64_t>();
    bad[37] = kVocab + 4;
    backend(ids).copy(from_vector(bad, {kRows, kContext}), ids);
    graph.replay();
    REQUIRE_THROWS_WITH(synchronize(kCuda), Contains("embedding") && Contains("at position 37") &&
                                                Contains("out of range for 17 rows"));
    backend(ids).copy(batch(round).first, ids);
  }
#endif
}

TEST_CASE("cuda: memory a capture allocated is not handed to other work", "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(6);
  const Tensor host = testing::random({256, 256}, DType::f32, g);
  const Tensor x = host.to(kCuda);
  Tensor out;
  // Two temporaries of out's size, released inside the work.
  auto work = [&] {
    const Tensor doubled = x * 2.0;
    const Tensor shifted = doubled + 1.0;
    out = shifted * shifted;
  };
  work();
  cuda::Graph graph(kCuda);
  graph.capture(work);
  // Eager tensors of the same size, allocated after the capture: had they been given the
  // graph's temporaries, every replay would overwrite them.
  std::vector<Tensor> eager;
  for (int i = 0; i < 4; ++i) eager.push_back(full({256, 256}, 7.0, {DType::f32, kCuda}));
  const size_t allocated = cuda::memory_stats(0).allocated;
  for (int i = 0; i < 3; ++i) graph.replay();
  const Tensor seven = full({256, 256}, 7.0);
  for (const Tensor& e : eager) CHECK(bitwise_equal(e.to(kCpu), seven));
  const Tensor shifted = host * 2.0 + 1.0;
  CHECK(bitwise_equal(out.to(kCpu), shifted * shifted));
  CHECK(cuda::memory_stats(0).allocated == allocated);
#endif
}

TEST_CASE("cuda: a Graph keeps its memory through empty_cache and leaves nothing once destroyed",
          "[cuda]") {
  if (!cuda_ready()) return;
#ifdef PIPIT_WITH_CUDA
  Generator g(12);
  const Tensor host_table = testing::random({kVocab, 64}, DType::f32, g);
  const Tensor table = host_table.to(kCuda), ids = batch(2).first.to(kCuda);
  const Tensor want = embedding(host_table, batch(2).first) * 2.0;
  synchronize(kCuda);
  cuda::empty_cache(0);
  const MemoryStats before = cuda::memory_stats(0);
  Tensor survivor;  // a result held past the Graph's end
  {
    cuda::Graph graph(kCuda);
    Tensor rows;
    // The embedding's result is a temporary the capture released: a block only the graph uses.
    graph.capture([&] { rows = embedding(table, ids) * 2.0; });
    // The temporary, cached on the graph's stream: empty_cache must leave it there.
    const size_t kept = cuda::memory_stats(0).reserved;
    REQUIRE(kept > before.reserved);
    graph.replay();
    cuda::empty_cache(0);
    CHECK(cuda::memory_stats(0).reserved == kept);
    graph.replay();
    CHECK(bitwise_equal(rows.to(kCpu), want));
    survivor = rows;
    // Destroyed with its replay's index checks still queued and its blocks cached.
  }
  REQUIRE_NOTHROW(synchronize(kCuda));
  CHECK(cuda::memory_stats(0).reserved == before.reserved);
  // The survivor's block outlived its stream: released, it goes to the default stream, whose
  // next allocation of that size takes it.
  const void* block = survivor.raw_data();
  survivor = Tensor();
  CHECK(cuda::memory_stats(0).reserved > before.reserved);
  {
    const Tensor next = Tensor::empty(want.shape(), DType::f32, kCuda);
    CHECK(next.raw_data() == block);
    CHECK(cuda::memory_stats(0).reserved == before.reserved);
  }
  CHECK(cuda::memory_stats(0).allocated == before.allocated);
#endif
}
