// generate()'s sampler and stop token, checked against what they must produce: many draws from
// fixed logits against the exact probabilities after temperature, top-k and top-p, and rows
// that stop at the stop token while the others go on. A stepper stands in for the model, so
// the logits are whatever the test says.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "nn/generate.h"
#include "tensor/factory.h"

using namespace pipit;

namespace {

// Logits chosen by the tokens fed so far: `logits_of(row, fed)` for each row, where `fed` is
// the row's tokens from its prompt on.
class ScriptedStepper final : public TokenStepper {
 public:
  using Script = std::function<std::vector<float>(int64_t row, const std::vector<int64_t>& fed)>;
  ScriptedStepper(int64_t vocab, int64_t context, Script script)
      : vocab_(vocab), context_(context), script_(std::move(script)) {}
  int64_t vocab_size() const override { return vocab_; }
  int64_t context() const override { return context_; }
  void begin(int64_t batch, int64_t, const std::vector<int64_t>&) override {
    fed_.assign(static_cast<size_t>(batch), {});
  }
  Tensor step(const Tensor& tokens, int64_t) override {
    ++steps;
    const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
    const std::vector<int64_t> ids = tokens.to_vector<int64_t>();
    std::vector<float> logits;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) fed_[size_t(b)].push_back(ids[size_t(b * T + t)]);
      const std::vector<float> row = script_(b, fed_[size_t(b)]);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    return from_vector(logits, {B, vocab_});
  }
  void end() override {}
  int64_t steps = 0;

 private:
  int64_t vocab_, context_;
  Script script_;
  std::vector<std::vector<int64_t>> fed_;
};

// How often each id was drawn in `rows` rows of `draws` tokens from `logits`.
std::vector<double> frequencies(const std::vector<float>& logits, const GenerationOptions& base,
                                int64_t rows, int64_t draws) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  ScriptedStepper stepper(vocab, draws + 1,
                          [&](int64_t, const std::vector<int64_t>&) { return logits; });
  GenerationOptions options = base;
  options.max_new_tokens = draws;
  const auto out = generate(stepper, std::vector<std::vector<int64_t>>(size_t(rows), {0}), options);
  std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
  for (const auto& row : out) {
    REQUIRE(static_cast<int64_t>(row.size()) == draws);
    for (const int64_t id : row) counts[size_t(id)] += 1;
  }
  for (double& c : counts) c /= static_cast<double>(rows * draws);
  return counts;
}

// The probabilities a draw must follow, written from the definitions: softmax of
// logits / temperature; only the top_k most likely ids (0: all); of those, the smallest set
// of most likely ids whose probability reaches top_p; renormalised.
std::vector<double> expected(const std::vector<float>& logits, double temperature, int64_t top_k,
                             double top_p) {
  const size_t vocab = logits.size();
  std::vector<double> p(vocab);
  const double top = *std::max_element(logits.begin(), logits.end()) / temperature;
  for (size_t i = 0; i < vocab; ++i) p[i] = std::exp(logits[i] / temperature - top);
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  const size_t k = top_k > 0 ? std::min(vocab, static_cast<size_t>(top_k)) : vocab;
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += p[order[i]];
  size_t kept = 0;
  for (double mass = 0; kept < k && (kept == 0 || mass < top_p - 1e-12);) {
    mass += p[order[kept++]] / total;
  }
  std::vector<double> q(vocab, 0.0);
  double kept_total = 0;
  for (size_t i = 0; i < kept; ++i) kept_total += p[order[i]];
  for (size_t i = 0; i < kept; ++i) q[order[i]] = p[order[i]] / kept_total;
  return q;
}

// Every id's frequency within 5 standard errors of its probability (a false alarm about once
// in 1.7 million checks per id), and ids of probability 0 never drawn.
void check_distribution(const std::vector<double>& got, const std::vector<double>& want,
                        int64_t n) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("id " << i << ": drawn " << got[i] << ", probability " << want[i]);
    if (want[i] == 0) {
      CHECK(got[i] == 0);
    } else {
      const double sigma = std::sqrt(want[i] * (1 - want[i]) / static_cast<double>(n));
      CHECK(std::abs(got[i] - want[i]) <= 5 * sigma);
    }
  }
}

const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.9f, 0.2f, -0.5f, -1.0f, -3.0f};

}  // namespace

TEST_CASE("sampling draws each id with its probability after temperature, top-k and top-p",
          "[generate]") {
  constexpr int64_t kRows = 40, kDraws = 500;  // 20,000 draws a case
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  // Temperatures that sharpen and flatten; a top-k that cuts within the mass; top-p values
  // just either side of a boundary (the first three ids hold 0.7561 at temperature 1), so an
  // off-by-one in the cut keeps a wrong set.
  for (const Case c : std::vector<Case>{{1.0, 0, 1.0},
                                        {0.5, 0, 1.0},
                                        {2.0, 0, 1.0},
                                        {1.0, 3, 1.0},
                                        {1.5, 4, 1.0},
                                        {1.0, 0, 0.75},
                                        {1.0, 0, 0.76},
                                        {0.8, 5, 0.9}}) {
    INFO("temperature " << c.temperature << ", top_k " << c.top_k << ", top_p " << c.top_p);
    GenerationOptions options;
    options.sample = true;
    options.temperature = c.temperature;
    options.top_k = c.top_k;
    options.top_p = c.top_p;
    options.seed = 11;
    const std::vector<double> want = expected(kLogits, c.temperature, c.top_k, c.top_p);
    check_distribution(frequencies(kLogits, options, kRows, kDraws), want, kRows * kDraws);
  }
  // The boundary cases are where they are meant to be: top_p 0.75 keeps three ids, 0.76 four.
  const auto kept = [](const std::vector<double>& q) {
    return std::count_if(q.begin(), q.end(), [](double p) { return p > 0; });
  };
  CHECK(kept(expected(kLogits, 1.0, 0, 0.75)) == 3);
  CHECK(kept(expected(kLogits, 1.0, 0, 0.76)) == 4);
}

TEST_CASE("a row stops at the stop token, kept as its last, while the other rows go on",
          "[generate]") {
  constexpr int64_t kVocab = 6, kStop = 5;
  // Greedy: row 0 counts up from its prompt's token and reaches the stop token at its third
  // new token; row 1 always answers 1, never the stop token.
  ScriptedStepper stepper(kVocab, 32, [&](int64_t row, const std::vector<int64_t>& fed) {
    std::vector<float> logits(kVocab, 0.0f);
    const int64_t next = row == 0 ? std::min<int64_t>(fed.back() + 1, kStop) : 1;
    logits[size_t(next)] = 1.0f;
    return logits;
  });
  GenerationOptions options;
  options.max_new_tokens = 8;
  options.stop_token = kStop;
  const auto out = generate(stepper, {{2}, {3}}, options);
  CHECK(out[0] == std::vector<int64_t>{3, 4, 5});
  CHECK(out[1] == std::vector<int64_t>(8, 1));
  // A batch whose rows all stop ends there: no step after the last row's stop token.
  ScriptedStepper stopping(kVocab, 32, [&](int64_t, const std::vector<int64_t>& fed) {
    std::vector<float> logits(kVocab, 0.0f);
    logits[size_t(std::min<int64_t>(fed.back() + 1, kStop))] = 1.0f;
    return logits;
  });
  CHECK(generate(stopping, {{3}, {4}}, options) == std::vector<std::vector<int64_t>>{{4, 5}, {5}});
  CHECK(stopping.steps == 2);  // the prompt's step and one after the first new tokens
  // Sampling stops the same way: the stop token is the only one with any probability.
  options.sample = true;
  options.seed = 3;
  ScriptedStepper certain(kVocab, 32, [&](int64_t, const std::vector<int64_t>&) {
    std::vector<float> logits(kVocab, -1e9f);
    logits[kStop] = 0.0f;
    return logits;
  });
  CHECK(generate(certain, {{0}, {1}, {2}}, options) ==
        std::vector<std::vector<int64_t>>(3, std::vector<int64_t>{kStop}));
}
