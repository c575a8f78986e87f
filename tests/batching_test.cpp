// Automatic batching (batching/): the scheduler's order, pruning and reuse on hand-made
// graphs; batched training equal to one-example-at-a-time training (Tree-LSTM, BiLSTM tagger);
// coroutine greedy decoding equal to one-at-a-time decoding; graphs built on threads; bad
// input named.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <thread>

#include "batching/batched.h"
#include "batching/bucket.h"
#include "batching/example.h"
#include "batching/gather_rows.h"
#include "batching/graph_queue.h"
#include "pipit.h"
#include "support/autobatch_models.h"

using namespace pipit;
using namespace pipit::batching;
using support::Sentence;
using support::Tree;

namespace {

using Batches = std::vector<std::vector<int32_t>>;

// The largest |a - b| / (1 + |b|) over two tensors' elements.
double max_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> x = a.contiguous().to_vector<float>(),
                           y = b.contiguous().to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(double(x[i]) - double(y[i])) / (1 + std::abs(double(y[i]))));
  }
  return worst;
}

std::vector<Tensor> gradients_of(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> out;
  for (const Tensor& p : parameters) out.push_back(p.grad().clone());
  return out;
}

void zero_gradients(const std::vector<Tensor>& parameters) {
  for (Tensor p : parameters) p.zero_grad();
}

// The gradients of `parameters` within 1e-5 of the ones taken one example at a time.
void check_gradients(const std::vector<Tensor>& parameters,
                     const std::vector<Tensor>& eager_grads) {
  const std::vector<Tensor> grads = gradients_of(parameters);
  for (size_t p = 0; p < grads.size(); ++p) {
    INFO("parameter " << p);
    CHECK(max_difference(grads[p], eager_grads[p]) < 1e-5);
  }
}

}  // namespace

TEST_CASE("the agenda runs the ready key of least mean depth; depth runs level by level",
          "[batching]") {
  auto f = batched_fn("f", [](const Tensor& x) { return x * 2.0; });
  auto g = batched_fn("g", [](const Tensor& x) { return x + 1.0; });
  for (Strategy strategy : {Strategy::agenda, Strategy::depth}) {
    Graph graph;
    auto scope = graph.scope();
    Handle v = batched_value(full({2}, 1.0));  // node 0
    Handle a3 = f(f(f(v)));                    // nodes 1, 2, 3
    Handle b3 = f(g(g(v)));                    // nodes 4, 5, 6
    graph.run(strategy);
    // agenda: f{1} and g{4} tie at depth 1 (f came first), then g{4} (mean 1 < 2), then f{2}
    // and g{5} tie at 2, then g{5}, then f{3} and f{6} at depth 3 run as one.
    // depth: depth 1: f{1}, g{4}; depth 2: f{2}, g{5}; depth 3: f{3, 6}.
    const Batches expected = {{1}, {4}, {2}, {5}, {3, 6}};
    CHECK(graph.last_batches() == expected);
    CHECK(max_difference(a3.value(), full({2}, 8.0)) == 0);
    CHECK(max_difference(b3.value(), full({2}, 6.0)) == 0);
  }
  Graph graph;
  auto scope = graph.scope();
  Handle v = batched_value(full({2}, 1.0));
  Handle deep = f(f(f(f(v))));  // nodes 1-4
  Handle shallow = g(v);        // node 5
  Handle mid = g(f(v));         // node 1 reused (f of v): node 6
  CHECK(mid.node() == 6);
  graph.run(Strategy::agenda);
  // Ready at first: f{1} (depth 1), g{5} (depth 1); then g{5} and g{6}, the second made
  // ready by f{1}, batch together.
  const Batches agenda = {{1}, {5, 6}, {2}, {3}, {4}};
  CHECK(graph.last_batches() == agenda);
}

TEST_CASE("nodes nobody needs are pruned; a repeated pure call is recorded once", "[batching]") {
  auto f = batched_fn("f", [](const Tensor& x) { return x * 2.0; });
  int calls = 0;
  auto counted = batched_fn("counted", [&calls](const Tensor& x) {
    ++calls;
    return x + 1.0;
  });
  Graph graph;
  auto scope = graph.scope();
  Handle v = batched_value(full({3}, 1.0));
  Handle kept = f(v);
  { Handle dropped = counted(f(f(v))); }  // nodes 2, 3: nobody holds them
  graph.run();
  CHECK(graph.last_batches() == Batches{{1}});
  CHECK(calls == 0);

  Handle once = f(kept), again = f(kept);
  CHECK(once.node() == again.node());
  Graph no_reuse(false);
  auto other = no_reuse.scope();
  Handle w = batched_value(full({3}, 1.0));
  CHECK(f(w).node() != f(w).node());
}

TEST_CASE("integer constants share i64 batches and batch with scalar tensor values", "[batching]") {
  // 2500 indices fill three of the graph's index batches (1024 rows each).
  constexpr int64_t kCount = 2500;
  const Tensor table = reshape(arange(0, 2 * kCount, 1, {DType::f32}), {kCount, 2});
  int calls = 0;
  auto lookup = batched_fn("lookup", [&](const Tensor& ids) {
    ++calls;
    return embedding(table, ids);
  });
  Graph graph;
  auto scope = graph.scope();
  std::vector<Handle> ids, rows;
  for (int64_t i = 0; i < kCount; ++i) {
    ids.push_back(batched_index(kCount - 1 - i));
    rows.push_back(lookup(ids.back()));
  }
  Handle from_tensor = lookup(batched_value(scalar_tensor(7, {DType::i64})));
  // The same pure call again is the same node, also once the reuse table has grown.
  for (int64_t i = 0; i < kCount; i += 97)
    CHECK(lookup(ids[size_t(i)]).node() == rows[size_t(i)].node());
  graph.run();
  CHECK(calls == 1);  // one key: index rows and the scalar tensor run as one batch
  for (int64_t i = 0; i < kCount; ++i) {
    const int64_t id = kCount - 1 - i;
    REQUIRE(ids[size_t(i)].value().item<int64_t>() == id);
    REQUIRE(rows[size_t(i)].value().to_vector<float>() ==
            std::vector<float>{float(2 * id), float(2 * id + 1)});
  }
  CHECK(from_tensor.value().to_vector<float>() == std::vector<float>{14, 15});

  // Recorded after a run, into the batch whose earlier rows were read: those keep their values.
  Handle late = lookup(batched_index(3));
  graph.run();
  CHECK(late.value().to_vector<float>() == std::vector<float>{6, 7});
  CHECK(ids[kCount - 1].value().item<int64_t>() == 0);

  graph.clear();
  CHECK_THROWS_WITH(ids[0].value(), Catch::Contains("cleared"));
  Handle fresh = lookup(batched_index(1));
  graph.run();
  CHECK(fresh.value().to_vector<float>() == std::vector<float>{2, 3});
}

TEST_CASE("gather_rows copies rows from several sources and sends gradients back", "[batching]") {
  Generator generator(3);
  Tensor a = randn({3, 2, 2}, &generator).requires_grad_();
  Tensor b = randn({2, 2, 2}, &generator).requires_grad_();
  Tensor a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  const Tensor weights = randn({4, 2, 2}, &generator);
  const Tensor got = gather_rows({a, b}, {{1, 0}, {0, 2}, {0, 2}, {1, 1}});
  const Tensor want =
      cat({narrow(b2, 0, 0, 1), narrow(a2, 0, 2, 1), narrow(a2, 0, 2, 1), narrow(b2, 0, 1, 1)}, 0);
  CHECK(max_difference(got, want) == 0);
  sum(got * weights).backward();
  sum(want * weights).backward();
  CHECK(max_difference(a.grad(), a2.grad()) == 0);
  CHECK(max_difference(b.grad(), b2.grad()) == 0);
  CHECK_THROWS_WITH(gather_rows({a}, {{0, 3}}), Catch::Contains("row 3 of source 0"));
}

TEST_CASE("a Tree-LSTM trains batched exactly as one tree at a time", "[batching]") {
  Generator generator(7);
  const support::TreeLstm model(50, 16, 24, 5, generator);
  std::vector<Tree> trees;
  for (int i = 0; i < 12; ++i) trees.push_back(support::random_tree(2 + i % 9, 50, 5, generator));
  trees.push_back(trees[3]);  // the same tree twice: its gradients count twice

  std::vector<Tensor> eager_losses;
  Tensor eager_total;
  for (const Tree& t : trees) {
    eager_losses.push_back(model.loss(t));
    eager_total = eager_total.defined() ? eager_total + eager_losses.back() : eager_losses.back();
  }
  eager_total.backward();
  const std::vector<Tensor> eager_grads = gradients_of(model.parameters());

  for (Strategy strategy : {Strategy::agenda, Strategy::depth}) {
    zero_gradients(model.parameters());
    Graph graph;
    auto scope = graph.scope();
    const support::TreeLstmBatched batched(model);
    std::vector<Handle> losses;
    for (const Tree& t : trees) losses.push_back(batched(t));
    graph.run(strategy);
    CHECK(graph.stats().batches_run < graph.stats().nodes_run / 4);
    const Tensor stacked = stack_values(losses);
    for (size_t i = 0; i < trees.size(); ++i) {
      INFO("tree " << i);
      CHECK(max_difference(reshape(losses[i].value(), {1}), eager_losses[i]) < 1e-5);
    }
    sum(stacked).backward();
    check_gradients(model.parameters(), eager_grads);
  }
}

TEST_CASE("a BiLSTM tagger over sentences of different lengths trains batched as one at a time",
          "[batching]") {
  Generator generator(8);
  const support::BiLstmTagger model(40, 12, 16, 6, generator);
  std::vector<Sentence> sentences;
  for (int i = 0; i < 10; ++i) {
    sentences.push_back(support::random_sentence(1 + (i * 7) % 11, 40, 6, generator));
  }
  Tensor eager_total;
  for (const Sentence& s : sentences) {
    Tensor l = model.loss({&s});
    eager_total = eager_total.defined() ? eager_total + l : l;
  }
  eager_total.backward();
  const std::vector<Tensor> eager_grads = gradients_of(model.parameters());
  zero_gradients(model.parameters());

  Graph graph;
  auto scope = graph.scope();
  const support::BiLstmBatched batched(model);
  const Handle zero_state = batched_value(zeros({model.hidden}));
  std::vector<Handle> losses;
  for (const Sentence& s : sentences) {
    for (Handle& h : batched(s, zero_state)) losses.push_back(std::move(h));
  }
  graph.run();
  // Ten sentences of 1 to 11 words, batched by position (measured: 244 nodes in 29 batches);
  // one sentence at a time would take a batch per node.
  CHECK(graph.stats().batches_run < graph.stats().nodes_run / 4);
  const Tensor total = sum(stack_values(losses));
  CHECK(max_difference(reshape(total, {1}), reshape(eager_total, {1})) < 1e-5);
  total.backward();
  check_gradients(model.parameters(), eager_grads);
}

TEST_CASE("coroutine greedy decoding equals decoding one example at a time, token for token",
          "[batching]") {
  NoGradGuard no_grad;
  Generator generator(9);
  // Token 0 ends a sequence; its score's bias makes the examples end at different times.
  const support::GreedyDecoder d(4, 6, 10, 8, 0.2f, 25, generator);
  const support::GreedyDecoder::Ops ops = d.batched();
  std::vector<Tensor> inputs;
  std::vector<std::vector<int64_t>> want;
  for (int i = 0; i < 24; ++i) {
    inputs.push_back(randn({4}, &generator) * 2.0);
    want.push_back(d.decode(inputs.back()));
  }
  std::set<size_t> lengths;
  for (const auto& w : want) lengths.insert(w.size());
  REQUIRE(lengths.size() >= 3);  // examples finish at different times

  SECTION("one group") {
    std::vector<std::vector<int64_t>> got(inputs.size());
    std::vector<Example> examples;
    for (size_t i = 0; i < inputs.size(); ++i)
      examples.push_back(d.decode_example(ops, inputs[i], got[i]));
    const ExampleStats stats = run_examples(examples);
    CHECK(got == want);
    // A round per co_await: one per token, plus the one that found the end token.
    int64_t rounds = 0;
    for (const auto& w : want) {
      const int64_t length = static_cast<int64_t>(w.size());
      rounds = std::max(rounds, length == d.limit ? length : length + 1);
    }
    CHECK(stats.rounds == rounds);
  }
  SECTION("three groups taking turns") {
    std::vector<std::vector<int64_t>> got(inputs.size());
    std::vector<std::vector<Example>> groups(3);
    for (size_t i = 0; i < inputs.size(); ++i)
      groups[i % 3].push_back(d.decode_example(ops, inputs[i], got[i]));
    run_examples(groups);
    CHECK(got == want);
  }
}

TEST_CASE("graphs built on several threads run together through a queue", "[batching]") {
  Generator generator(10);
  const support::TreeLstm model(30, 8, 12, 3, generator);
  std::vector<Tree> trees;
  for (int i = 0; i < 32; ++i) trees.push_back(support::random_tree(2 + i % 7, 30, 3, generator));
  NoGradGuard no_grad;
  std::vector<double> want;
  for (const Tree& t : trees) want.push_back(model.loss(t).item<double>());

  GraphQueue queue(4);
  std::vector<std::thread> builders;
  for (int b = 0; b < 4; ++b) {
    builders.emplace_back([&, b] {
      for (int part = 0; part < 2; ++part) {
        BuiltGraph built{std::make_unique<Graph>(), {}, b * 2 + part};
        auto scope = built.graph->scope();
        const support::TreeLstmBatched batched(model);
        for (int i = 0; i < 4; ++i)
          built.results.push_back(batched(trees[static_cast<size_t>(built.tag * 4 + i)]));
        queue.push(std::move(built));
      }
    });
  }
  std::thread closer([&] {
    for (auto& t : builders) t.join();
    queue.close();
  });
  std::vector<double> got(trees.size(), -1);
  while (true) {
    std::vector<BuiltGraph> taken = queue.pop_some(8);
    if (taken.empty()) break;
    Graph merged;
    for (BuiltGraph& b : taken) merged.merge(*b.graph);
    merged.run();
    for (BuiltGraph& b : taken) {
      for (size_t i = 0; i < b.results.size(); ++i) {
        got[static_cast<size_t>(b.tag * 4) + i] = b.results[i].value().item<double>();
      }
    }
  }
  closer.join();
  for (size_t i = 0; i < trees.size(); ++i) {
    INFO("tree " << i);
    CHECK(std::abs(got[i] - want[i]) < 1e-5);
  }
}

TEST_CASE("batching errors name the node and its key; nothing hangs", "[batching]") {
  auto f = batched_fn("f", [](const Tensor& x) { return x * 2.0; });
  CHECK_THROWS_WITH(f(Handle()), Catch::Contains("outside a batching scope"));
  Graph one, two;
  Handle from_one;
  {
    auto scope = one.scope();
    from_one = f(batched_value(full({2}, 1.0)));
    CHECK_THROWS_WITH(from_one.value(),
                      Catch::Contains("node 1 (f)") && Catch::Contains("has not run"));
  }
  {
    auto scope = two.scope();
    CHECK_THROWS_WITH(f(from_one), Catch::Contains("node 1 (f) of another graph"));
  }
  one.clear();
  CHECK_THROWS_WITH(from_one.value(), Catch::Contains("cleared"));

  auto broken = batched_fn("broken", [](const Tensor& x) -> Tensor {
    PIPIT_CHECK(x.size(0) < 2, "cannot take ", x.size(0), " rows");
    return x;
  });
  Graph graph;
  auto scope = graph.scope();
  Handle a = broken(batched_value(full({2}, 1.0))), b = broken(batched_value(full({2}, 2.0)));
  CHECK_THROWS_WITH(graph.run(), Catch::Contains("key broken #") && Catch::Contains("batch of 2") &&
                                     Catch::Contains("cannot take 2 rows"));

  // Examples waiting on a failed batch are resumed with its error.
  auto waits_on_broken = [&broken](Tensor x) -> Example { co_await broken(batched_value(x)); };
  std::vector<Example> examples;
  examples.push_back(waits_on_broken(full({2}, 1.0)));
  examples.push_back(waits_on_broken(full({2}, 2.0)));
  CHECK_THROWS_WITH(run_examples(examples),
                    Catch::Contains("example 0 failed") && Catch::Contains("cannot take 2 rows"));
}
