// Trains a binary Tree-LSTM sentence classifier with automatic batching (batching/): the code
// walks one tree at a time, and pipit runs the nodes of a whole minibatch of trees as batches
// (every leaf at once, then the compositions whose children are done, ...). The data is made
// here: random binary trees over random words, each word positive, negative or neutral, the
// label whether the tree's words are more positive than negative.
//   build/tree_lstm                       # 2000 trees, batch 64, 5 epochs
//   build/tree_lstm --strategy depth --batch 16
#include <chrono>
#include <cstdio>

#include "batching/bucket.h"
#include "batching/graph.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/autobatch_models.h"
#include "support/flags.h"
#include "support/run_flags.h"

using namespace pipit;
using namespace pipit::batching;

namespace {

// Word w's polarity is w % 3 - 1; the label, whether the polarities sum above zero.
std::vector<support::Tree> make_trees(int64_t count, int64_t min_leaves, int64_t max_leaves,
                                      int64_t vocabulary, Generator& generator) {
  std::vector<support::Tree> trees;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t leaves =
        min_leaves + static_cast<int64_t>(generator.bits(generator.reserve(1)) %
                                          static_cast<uint64_t>(max_leaves - min_leaves + 1));
    support::Tree tree = support::random_tree(leaves, vocabulary, 2, generator);
    int64_t polarity = 0;
    for (const auto& node : tree.nodes) {
      if (node.left < 0) polarity += node.word % 3 - 1;
    }
    tree.label = polarity > 0 ? 1 : 0;
    trees.push_back(tree);
  }
  return trees;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("tree_lstm", "Trains a Tree-LSTM classifier with automatic batching.");
  flags.add("trees", "2000", "training trees (and a quarter as many held out)");
  flags.add("min-leaves", "10", "fewest leaves of a tree");
  flags.add("max-leaves", "50", "most leaves of a tree");
  flags.add("batch", "64", "trees per optimizer step (one batched graph)");
  flags.add("epochs", "5", "passes over the training trees");
  flags.add("width", "128", "hidden width (and word embedding width)");
  flags.add("lr", "0.005", "AdamW learning rate");
  flags.add("strategy", "agenda", "agenda (DyNet's) or depth");
  support::add_seed_flag(flags, "1", "data and weights");
  flags.parse(argc, argv);
  const int64_t vocabulary = 300;
  const int64_t batch = flags.integer("batch"), width = flags.integer("width");
  const int64_t min_leaves = flags.integer("min-leaves"), max_leaves = flags.integer("max-leaves");
  if (batch < 1) flags.fail("--batch must be at least 1");
  if (min_leaves < 1 || max_leaves < min_leaves) {
    flags.fail("--min-leaves and --max-leaves need 1 <= min <= max");
  }
  const std::string strategy_name = flags.choice("strategy", {"agenda", "depth"});
  const Strategy strategy = strategy_name == "agenda" ? Strategy::agenda : Strategy::depth;

  Generator generator(support::seed_flag(flags));
  const int64_t count = flags.integer("trees");
  const std::vector<support::Tree> train =
      make_trees(count, min_leaves, max_leaves, vocabulary, generator);
  const std::vector<support::Tree> held_out =
      make_trees(std::max<int64_t>(1, count / 4), min_leaves, max_leaves, vocabulary, generator);
  const support::TreeLstm model(vocabulary, width, width, 2, generator);
  const support::TreeLstmBatched batched(model);
  NamedParameters parameters;
  const std::vector<Tensor> tensors = model.parameters();
  for (size_t i = 0; i < tensors.size(); ++i)
    parameters.emplace_back(std::to_string(i), tensors[i]);
  auto optimizer = make_optimizer({{"type", "AdamW"}, {"lr", flags.number("lr")}}, parameters);
  auto classify = batched_fn("classify", [&model](const Tensor& h) { return model.logits(h); });

  std::vector<int64_t> sizes;
  for (const auto& t : train) sizes.push_back(t.leaves());
  std::printf("tree_lstm: %zu training trees of %lld-%lld leaves, width %lld, batch %lld, %s\n",
              train.size(), static_cast<long long>(min_leaves), static_cast<long long>(max_leaves),
              static_cast<long long>(width), static_cast<long long>(batch), strategy_name.c_str());
  for (int64_t epoch = 1; epoch <= flags.integer("epochs"); ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    double total_loss = 0;
    GraphStats stats;
    // Trees of similar size side by side: their graphs batch better.
    for (const std::vector<int64_t>& indices : bucket_by_size(sizes, batch)) {
      Graph graph;
      auto scope = graph.scope();
      std::vector<Handle> losses;
      for (int64_t i : indices) losses.push_back(batched(train[static_cast<size_t>(i)]));
      graph.run(strategy);
      Tensor loss = sum(stack_values(losses)) * (1.0 / static_cast<double>(indices.size()));
      optimizer->zero_grad();
      loss.backward();
      optimizer->step();
      total_loss += loss.item<double>() * static_cast<double>(indices.size());
      stats.nodes_run += graph.stats().nodes_run;
      stats.batches_run += graph.stats().batches_run;
      stats.plan_seconds += graph.stats().plan_seconds;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t right = 0;
    {
      NoGradGuard no_grad;
      Graph graph;
      auto scope = graph.scope();
      std::vector<Handle> logits;
      for (const auto& t : held_out) logits.push_back(classify(batched.encode(t)));
      graph.run(strategy);
      const std::vector<int64_t> predicted = argmax(stack_values(logits), 1).to_vector<int64_t>();
      for (size_t i = 0; i < held_out.size(); ++i) right += predicted[i] == held_out[i].label;
    }
    std::printf(
        "epoch %lld  loss %.4f  held-out accuracy %.1f%%  %.0f trees/s  %.1f nodes per batch  "
        "scheduling %.1f%% of the time\n",
        static_cast<long long>(epoch), total_loss / static_cast<double>(train.size()),
        100.0 * static_cast<double>(right) / static_cast<double>(held_out.size()),
        static_cast<double>(train.size()) / seconds,
        static_cast<double>(stats.nodes_run) / static_cast<double>(stats.batches_run),
        100.0 * stats.plan_seconds / seconds);
  }
  return 0;
}
