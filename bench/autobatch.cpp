// Automatic batching against one example at a time and against batching by hand, on the
// tasks of the DyNet autobatching paper (Neubig, Goldberg, Dyer 2017): Tree-LSTM training on
// random binary trees, BiLSTM tagger training on sentences of varying length, and greedy
// LSTM decoding (inference, with coroutines). Examples per second, side by side in one run:
// (a) one example at a time, the same model code on batches of one; (b) autobatched, agenda
// and depth strategies; (c) the BiLSTM batched by hand with padding and masks. Scheduling
// overhead: the time spent recording nodes and scheduling, over the step's time.
//   build/autobatch                  # appends to bench/RESULTS.md (--no-append to skip)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>

#include "batching/bucket.h"
#include "batching/example.h"
#include "bench/results.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/autobatch_models.h"
#include "support/flags.h"
#include "support/run_flags.h"

using namespace pipit;
using namespace pipit::batching;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Optimizer> adamw(const std::vector<Tensor>& tensors) {
  NamedParameters named;
  for (size_t i = 0; i < tensors.size(); ++i) named.emplace_back(std::to_string(i), tensors[i]);
  return make_optimizer({{"type", "AdamW"}, {"lr", 1e-3}}, named);
}

struct Rate {
  double examples_per_second = 0;
  double overhead = 0;     // recording + scheduling, as a share of the time
  double us_per_node = 0;  // recording + scheduling per node run
};

// What one minibatch's step spent outside the batched computation.
struct StepCost {
  double overhead_seconds = 0;
  int64_t nodes = 0;
};

// Trains on `count` examples in minibatches of `batch`; `step(indices)` does one minibatch and
// returns the seconds it spent recording and scheduling.
Rate time_training(int64_t count, int64_t batch, const std::vector<int64_t>& sizes,
                   const std::function<StepCost(const std::vector<int64_t>&)>& step) {
  std::vector<int64_t> head(sizes.begin(), sizes.begin() + count);
  const std::vector<std::vector<int64_t>> batches = bucket_by_size(head, batch);
  step(batches.front());  // warm-up: allocations, first-touch
  double overhead = 0;
  int64_t nodes = 0;
  const auto start = Clock::now();
  for (const auto& indices : batches) {
    const StepCost cost = step(indices);
    overhead += cost.overhead_seconds;
    nodes += cost.nodes;
  }
  const double seconds = bench::seconds_since(start);
  return {static_cast<double>(count) / seconds, overhead / seconds,
          nodes > 0 ? 1e6 * overhead / static_cast<double>(nodes) : 0.0};
}

// Runs each measurement `rounds` times, taking turns, and keeps each one's median: run one
// after another, the first would meet colder caches and a different machine load (that made
// whichever strategy ran second look 10-20% faster).
std::vector<Rate> in_turns(int rounds, const std::vector<std::function<Rate()>>& measurements) {
  std::vector<std::vector<Rate>> runs(measurements.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < measurements.size(); ++i) runs[i].push_back(measurements[i]());
  }
  std::vector<Rate> medians;
  for (auto& rates : runs) {
    std::sort(rates.begin(), rates.end(), [](const Rate& a, const Rate& b) {
      return a.examples_per_second < b.examples_per_second;
    });
    medians.push_back(rates[rates.size() / 2]);
  }
  return medians;
}

// One autobatched training step: `record` adds the minibatch's losses to the scope's graph.
StepCost autobatched_step(Optimizer& optimizer, Strategy strategy,
                          const std::function<void(std::vector<Handle>&)>& record) {
  const auto start = Clock::now();
  Graph graph;
  auto scope = graph.scope();
  std::vector<Handle> losses;
  record(losses);
  const double recording = bench::seconds_since(start);
  graph.run(strategy);
  optimizer.zero_grad();
  sum(stack_values(losses)).backward();
  optimizer.step();
  return StepCost{recording + graph.stats().plan_seconds, graph.stats().nodes_run};
}

constexpr int kRounds = 3;

std::string ratio(double a, double b) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1fx", a / b);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("autobatch", "Automatic batching vs one at a time and by hand.");
  support::add_threads_flag(flags, "1");
  flags.add("examples", "512", "examples per batched measurement (a quarter one at a time)");
  flags.add("end-bias", "1", "decoding: the end token's score bias (sets the lengths)");
  bench::add_no_append_flag(flags);
  flags.parse(argc, argv);
  set_num_threads(static_cast<int>(flags.integer("threads")));
  const int64_t examples = flags.integer("examples");
  const std::vector<int64_t> batch_sizes = {16, 64, 256};
  Generator generator(1);
  std::ostringstream out;
  out << "`build/autobatch --threads " << get_num_threads() << " --examples " << examples
      << "`: examples/s training (forward, backward, AdamW) or decoding; one at a time runs a "
         "quarter as many examples. Each rate is the median of 3 runs, the methods taking turns. "
         "Overhead: recording nodes plus scheduling, share of the time.\n\n";

  // Tree-LSTM: trees of 10-50 leaves, width 128.
  {
    const support::TreeLstm model(1000, 128, 128, 5, generator);
    const support::TreeLstmBatched batched(model);
    std::vector<support::Tree> trees;
    std::vector<int64_t> sizes;
    for (int64_t i = 0; i < examples; ++i) {
      trees.push_back(
          support::random_tree(10 + static_cast<int64_t>(generator.bits(generator.reserve(1)) % 41),
                               1000, 5, generator));
      sizes.push_back(trees.back().leaves());
    }
    auto optimizer = adamw(model.parameters());
    auto one_at_a_time = [&](const std::vector<int64_t>& indices) {
      optimizer->zero_grad();
      for (int64_t i : indices) model.loss(trees[static_cast<size_t>(i)]).backward();
      optimizer->step();
      return StepCost{};
    };
    auto autobatched = [&](Strategy strategy) {
      return [&, strategy](const std::vector<int64_t>& indices) {
        return autobatched_step(*optimizer, strategy, [&](std::vector<Handle>& losses) {
          for (int64_t i : indices) losses.push_back(batched(trees[static_cast<size_t>(i)]));
        });
      };
    };
    out << "Tree-LSTM training, binary trees of 10-50 leaves, width 128, 5 classes:\n\n"
        << "| batch | one at a time | agenda | depth | agenda / one at a time | overhead (agenda) "
           "| us per node |\n"
        << "| --- | --- | --- | --- | --- | --- | --- |\n";
    for (int64_t batch : batch_sizes) {
      const std::vector<Rate> rates = in_turns(
          kRounds,
          {[&] { return time_training(examples / 4, batch, sizes, one_at_a_time); },
           [&] { return time_training(examples, batch, sizes, autobatched(Strategy::agenda)); },
           [&] { return time_training(examples, batch, sizes, autobatched(Strategy::depth)); }});
      const Rate &single = rates[0], &agenda = rates[1], &depth = rates[2];
      char row[256];
      std::snprintf(row, sizeof row, "| %lld | %.0f | %.0f | %.0f | %s | %.1f%% | %.2f |\n",
                    static_cast<long long>(batch), single.examples_per_second,
                    agenda.examples_per_second, depth.examples_per_second,
                    ratio(agenda.examples_per_second, single.examples_per_second).c_str(),
                    100 * agenda.overhead, agenda.us_per_node);
      out << row;
      std::printf("%s", row);
      std::fflush(stdout);
    }
  }
  // BiLSTM tagger: sentences of 5-50 words, embeddings 64, hidden 128.
  {
    const support::BiLstmTagger model(1000, 64, 128, 10, generator);
    const support::BiLstmBatched batched(model);
    std::vector<support::Sentence> sentences;
    std::vector<int64_t> sizes;
    for (int64_t i = 0; i < examples; ++i) {
      sentences.push_back(support::random_sentence(
          5 + static_cast<int64_t>(generator.bits(generator.reserve(1)) % 46), 1000, 10,
          generator));
      sizes.push_back(static_cast<int64_t>(sentences.back().words.size()));
    }
    auto optimizer = adamw(model.parameters());
    auto one_at_a_time = [&](const std::vector<int64_t>& indices) {
      optimizer->zero_grad();
      for (int64_t i : indices) model.loss({&sentences[static_cast<size_t>(i)]}).backward();
      optimizer->step();
      return StepCost{};
    };
    auto by_hand = [&](const std::vector<int64_t>& indices) {
      std::vector<const support::Sentence*> batch;
      for (int64_t i : indices) batch.push_back(&sentences[static_cast<size_t>(i)]);
      optimizer->zero_grad();
      model.padded_loss(batch).backward();
      optimizer->step();
      return StepCost{};
    };
    auto autobatched = [&](Strategy strategy) {
      return [&, strategy](const std::vector<int64_t>& indices) {
        return autobatched_step(*optimizer, strategy, [&](std::vector<Handle>& losses) {
          const Handle zero_state = batched_value(zeros({model.hidden}));
          for (int64_t i : indices) {
            for (Handle& h : batched(sentences[static_cast<size_t>(i)], zero_state)) {
              losses.push_back(std::move(h));
            }
          }
        });
      };
    };
    out << "\nBiLSTM tagger training, sentences of 5-50 words, embeddings 64, hidden 128, 10 "
           "tags; by hand: the minibatch padded to its longest sentence, with masks "
           "(minibatches of similar lengths, as every column here):\n\n"
        << "| batch | one at a time | agenda | depth | by hand (padded) | agenda / one at a time "
           "| by hand / agenda | overhead (agenda) | us per node |\n"
        << "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (int64_t batch : batch_sizes) {
      const std::vector<Rate> rates = in_turns(
          kRounds,
          {[&] { return time_training(examples / 4, batch, sizes, one_at_a_time); },
           [&] { return time_training(examples, batch, sizes, autobatched(Strategy::agenda)); },
           [&] { return time_training(examples, batch, sizes, autobatched(Strategy::depth)); },
           [&] { return time_training(examples, batch, sizes, by_hand); }});
      const Rate &single = rates[0], &agenda = rates[1], &depth = rates[2], &hand = rates[3];
      char row[320];
      std::snprintf(row, sizeof row,
                    "| %lld | %.0f | %.0f | %.0f | %.0f | %s | %s | %.1f%% | %.2f |\n",
                    static_cast<long long>(batch), single.examples_per_second,
                    agenda.examples_per_second, depth.examples_per_second, hand.examples_per_second,
                    ratio(agenda.examples_per_second, single.examples_per_second).c_str(),
                    ratio(hand.examples_per_second, agenda.examples_per_second).c_str(),
                    100 * agenda.overhead, agenda.us_per_node);
      out << row;
      std::printf("%s", row);
      std::fflush(stdout);
    }
  }

  // Greedy decoding (inference): an LSTM decoder from a 64-wide input, hidden 128, 1000
  // tokens, until token 0 or 40 tokens; coroutines, one group or two taking turns.
  {
    NoGradGuard no_grad;
    Generator generator(5);  // its own, so the lengths do not depend on --examples
    const support::GreedyDecoder decoder(
        64, 64, 128, 1000, static_cast<float>(flags.number("end-bias")), 40, generator);
    std::vector<Tensor> inputs;
    for (int64_t i = 0; i < examples; ++i) inputs.push_back(randn({64}, &generator));
    const auto ops = decoder.batched();
    out << "\nGreedy decoding (inference), LSTM hidden 128, vocabulary 1000, at most 40 tokens: "
           "examples/s (mean tokens per example: in the row)\n\n"
        << "| batch | one at a time | coroutines, 1 group | coroutines, 2 groups | 1 group / one "
           "at a time | scheduling (1 group) | tokens |\n"
        << "| --- | --- | --- | --- | --- | --- | --- |\n";
    for (int64_t batch : batch_sizes) {
      const int64_t count = std::min<int64_t>(examples, std::max<int64_t>(batch, 128));
      int64_t tokens = 0;
      auto one_at_a_time = [&] {
        tokens = 0;
        auto start = Clock::now();
        for (int64_t i = 0; i < count / 4; ++i) {
          tokens += static_cast<int64_t>(decoder.decode(inputs[static_cast<size_t>(i)]).size());
        }
        return Rate{static_cast<double>(count / 4) / bench::seconds_since(start)};
      };
      auto run = [&](int groups) {
        std::vector<std::vector<int64_t>> results(static_cast<size_t>(count));
        double overhead = 0;
        const auto begin = Clock::now();
        for (int64_t first = 0; first < count; first += batch) {
          std::vector<std::vector<Example>> examples_of(static_cast<size_t>(groups));
          for (int64_t i = first; i < std::min(count, first + batch); ++i) {
            examples_of[static_cast<size_t>(i % groups)].push_back(decoder.decode_example(
                ops, inputs[static_cast<size_t>(i)], results[static_cast<size_t>(i)]));
          }
          const ExampleStats stats = run_examples(examples_of);
          overhead += stats.graph.plan_seconds;
        }
        const double seconds = bench::seconds_since(begin);
        return Rate{static_cast<double>(count) / seconds, overhead / seconds};
      };
      const std::vector<Rate> rates =
          in_turns(kRounds, {one_at_a_time, [&] { return run(1); }, [&] { return run(2); }});
      const double single = rates[0].examples_per_second;
      const Rate &one = rates[1], &two = rates[2];
      char row[320];
      std::snprintf(row, sizeof row, "| %lld | %.0f | %.0f | %.0f | %s | %.1f%% | %.1f |\n",
                    static_cast<long long>(batch), single, one.examples_per_second,
                    two.examples_per_second, ratio(one.examples_per_second, single).c_str(),
                    100 * one.overhead,
                    static_cast<double>(tokens) / static_cast<double>(count / 4));
      out << row;
      std::printf("%s", row);
      std::fflush(stdout);
    }
  }
  std::printf("%s", out.str().c_str());
  if (!flags.on("no-append")) bench::append_results("autobatch", out.str());
  return 0;
}
