#pragma once
// The models of automatic batching's sample, tests and benchmark (after the DyNet
// autobatching paper): a binary Tree-LSTM classifier over random trees, a BiLSTM tagger over
// variable-length sentences, and an LSTM greedy decoder. Each step is a plain tensor function
// on a batch (dim 0), so the same code runs one example at a time (a batch of one), batched
// by hand, or wrapped with batched_fn and batched automatically.
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "batching/batched.h"
#include "batching/example.h"
#include "tensor/factory.h"
#include "tensor/generator.h"

namespace pipit::support {

using batching::batched_index;
using batching::Handle;

inline Tensor uniform_parameter(Shape shape, double bound, Generator& g) {
  return uniform(std::move(shape), -bound, bound, &g).requires_grad_();
}

// -log softmax(logits)[target] per row: logits [k, C], targets [k] i64 -> [k].
inline Tensor nll_per_row(const Tensor& logits, const Tensor& targets) {
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  const int64_t classes = logits.size(1);
  std::vector<float> one_hot(t.size() * static_cast<size_t>(classes), 0.0f);
  for (size_t i = 0; i < t.size(); ++i)
    one_hot[i * static_cast<size_t>(classes) + static_cast<size_t>(t[i])] = 1.0f;
  const Tensor mask = from_vector(one_hot, {static_cast<int64_t>(t.size()), classes});
  return neg(sum(log_softmax(logits, 1) * mask, {1}));
}

// LSTM cell: (x [k, in], h [k, H], c [k, H]) -> (h', c').
struct LstmCell {
  Tensor weight, bias;  // [4H, in + H], [4H]
  LstmCell(int64_t in, int64_t hidden, Generator& g)
      : weight(uniform_parameter({4 * hidden, in + hidden}, 1.0 / std::sqrt(double(hidden)), g)),
        bias(uniform_parameter({4 * hidden}, 1.0 / std::sqrt(double(hidden)), g)) {}
  std::vector<Tensor> step(const Tensor& x, const Tensor& h, const Tensor& c) const {
    const std::vector<Tensor> gates = chunk(linear(cat({x, h}, 1), weight, bias), 4, 1);
    Tensor next_c = sigmoid(gates[1]) * c + sigmoid(gates[0]) * tanh(gates[2]);
    Tensor next_h = sigmoid(gates[3]) * tanh(next_c);
    return {next_h, next_c};
  }
  std::vector<Tensor> parameters() const { return {weight, bias}; }
};

// A binary tree over a sentence: nodes in post-order, the root last.
struct Tree {
  struct Node {
    int32_t left = -1, right = -1;  // -1: a leaf
    int64_t word = 0;
  };
  std::vector<Node> nodes;
  int64_t label = 0;
  int64_t leaves() const { return static_cast<int64_t>(nodes.size() + 1) / 2; }
};

// A random tree of `leaves` leaves (random split points), random words and a label.
inline Tree random_tree(int64_t leaves, int64_t vocabulary, int64_t classes, Generator& g) {
  Tree tree;
  auto draw = [&g](int64_t n) {
    return static_cast<int64_t>(g.bits(g.reserve(1)) % static_cast<uint64_t>(n));
  };
  auto build = [&](auto&& self, int64_t n) -> int32_t {
    Tree::Node node;
    if (n == 1) {
      node.word = draw(vocabulary);
    } else {
      const int64_t left = 1 + draw(n - 1);
      node.left = self(self, left);
      node.right = self(self, n - left);
    }
    tree.nodes.push_back(node);
    return static_cast<int32_t>(tree.nodes.size() - 1);
  };
  build(build, leaves);
  tree.label = draw(classes);
  return tree;
}

// Binary Tree-LSTM (Tai et al. 2015) with a classifier on the root.
struct TreeLstm {
  Tensor embedding;       // [V, D]
  Tensor leaf_w, leaf_b;  // [3H, D]: input, output, update gates of a leaf
  Tensor node_w, node_b;  // [5H, 2H]: input, left forget, right forget, output, update
  Tensor out_w, out_b;    // [C, H]
  TreeLstm(int64_t vocabulary, int64_t dim, int64_t hidden, int64_t classes, Generator& g)
      : embedding(uniform_parameter({vocabulary, dim}, 0.1, g)),
        leaf_w(uniform_parameter({3 * hidden, dim}, 1.0 / std::sqrt(double(dim)), g)),
        leaf_b(uniform_parameter({3 * hidden}, 0.1, g)),
        node_w(
            uniform_parameter({5 * hidden, 2 * hidden}, 1.0 / std::sqrt(2.0 * double(hidden)), g)),
        node_b(uniform_parameter({5 * hidden}, 0.1, g)),
        out_w(uniform_parameter({classes, hidden}, 1.0 / std::sqrt(double(hidden)), g)),
        out_b(uniform_parameter({classes}, 0.1, g)) {}

  // words [k] i64 -> (h, c)
  std::vector<Tensor> leaf(const Tensor& words) const {
    const std::vector<Tensor> g =
        chunk(linear(pipit::embedding(embedding, words), leaf_w, leaf_b), 3, 1);
    Tensor c = sigmoid(g[0]) * tanh(g[2]);
    return {sigmoid(g[1]) * tanh(c), c};
  }
  std::vector<Tensor> compose(const Tensor& hl, const Tensor& cl, const Tensor& hr,
                              const Tensor& cr) const {
    const std::vector<Tensor> g = chunk(linear(cat({hl, hr}, 1), node_w, node_b), 5, 1);
    Tensor c = sigmoid(g[0]) * tanh(g[4]) + sigmoid(g[1]) * cl + sigmoid(g[2]) * cr;
    return {sigmoid(g[3]) * tanh(c), c};
  }
  Tensor logits(const Tensor& h) const { return linear(h, out_w, out_b); }
  std::vector<Tensor> parameters() const {
    return {embedding, leaf_w, leaf_b, node_w, node_b, out_w, out_b};
  }

  // One tree, eagerly (a batch of one): its loss, [1].
  Tensor loss(const Tree& tree) const {
    std::vector<std::vector<Tensor>> state(tree.nodes.size());
    for (size_t i = 0; i < tree.nodes.size(); ++i) {
      const Tree::Node& n = tree.nodes[i];
      state[i] = n.left < 0 ? leaf(from_vector<int64_t>({n.word}, {1}))
                            : compose(state[static_cast<size_t>(n.left)][0],
                                      state[static_cast<size_t>(n.left)][1],
                                      state[static_cast<size_t>(n.right)][0],
                                      state[static_cast<size_t>(n.right)][1]);
    }
    return nll_per_row(logits(state.back()[0]), from_vector<int64_t>({tree.label}, {1}));
  }
};

// A sentence and its tags.
struct Sentence {
  std::vector<int64_t> words, tags;
};

inline Sentence random_sentence(int64_t length, int64_t vocabulary, int64_t tags, Generator& g) {
  Sentence s;
  for (int64_t i = 0; i < length; ++i) {
    s.words.push_back(
        static_cast<int64_t>(g.bits(g.reserve(1)) % static_cast<uint64_t>(vocabulary)));
    s.tags.push_back(s.words.back() % tags);  // learnable: a word's tag is fixed
  }
  return s;
}

// BiLSTM tagger: embeddings, a forward and a backward LSTM, a tag classifier per word.
struct BiLstmTagger {
  Tensor embedding;  // [V, D]
  LstmCell forward_cell, backward_cell;
  Tensor out_w, out_b;  // [T, 2H]
  int64_t hidden;
  BiLstmTagger(int64_t vocabulary, int64_t dim, int64_t hidden_size, int64_t tags, Generator& g)
      : embedding(uniform_parameter({vocabulary, dim}, 0.1, g)),
        forward_cell(dim, hidden_size, g),
        backward_cell(dim, hidden_size, g),
        out_w(uniform_parameter({tags, 2 * hidden_size}, 1.0 / std::sqrt(2.0 * double(hidden_size)),
                                g)),
        out_b(uniform_parameter({tags}, 0.1, g)),
        hidden(hidden_size) {}

  Tensor embed(const Tensor& words) const { return pipit::embedding(embedding, words); }
  Tensor tag_logits(const Tensor& hf, const Tensor& hb) const {
    return linear(cat({hf, hb}, 1), out_w, out_b);
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p = {embedding, out_w, out_b};
    for (const Tensor& t : forward_cell.parameters()) p.push_back(t);
    for (const Tensor& t : backward_cell.parameters()) p.push_back(t);
    return p;
  }

  // The forward and the backward LSTM's hidden states at every position of `xs` (k rows each).
  // With `masks`, the backward state is held at zero where a row's mask is 0 (its padding).
  std::pair<std::vector<Tensor>, std::vector<Tensor>> hidden_states(
      const std::vector<Tensor>& xs, int64_t k, const std::vector<Tensor>& masks = {}) const {
    const size_t n = xs.size();
    std::vector<Tensor> hf(n), hb(n);
    Tensor h = zeros({k, hidden}), c = zeros({k, hidden});
    for (size_t i = 0; i < n; ++i) {
      auto next = forward_cell.step(xs[i], h, c);
      h = hf[i] = next[0];
      c = next[1];
    }
    h = zeros({k, hidden});
    c = zeros({k, hidden});
    for (size_t i = n; i-- > 0;) {
      auto next = backward_cell.step(xs[i], h, c);
      h = hb[i] = masks.empty() ? next[0] : next[0] * masks[i];
      c = masks.empty() ? next[1] : next[1] * masks[i];
    }
    return {hf, hb};
  }

  // Sentences of one length, batched by hand (rows = sentences): the summed loss. With one
  // sentence, the one-at-a-time baseline.
  Tensor loss(const std::vector<const Sentence*>& batch) const {
    const int64_t k = static_cast<int64_t>(batch.size());
    const size_t n = batch[0]->words.size();
    std::vector<Tensor> xs;
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> words;
      for (const Sentence* s : batch) words.push_back(s->words[i]);
      xs.push_back(embed(from_vector(words, {k})));
    }
    const auto [hf, hb] = hidden_states(xs, k);
    Tensor total;
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> tags;
      for (const Sentence* s : batch) tags.push_back(s->tags[i]);
      Tensor l = sum(nll_per_row(tag_logits(hf[i], hb[i]), from_vector(tags, {k})));
      total = total.defined() ? total + l : l;
    }
    return total;
  }

  // Sentences of any lengths batched by hand: padded to the longest, the backward LSTM's
  // state held at zero over each sentence's padding and the padding's losses masked out.
  Tensor padded_loss(const std::vector<const Sentence*>& batch) const {
    const int64_t k = static_cast<int64_t>(batch.size());
    size_t longest = 0;
    for (const Sentence* s : batch) longest = std::max(longest, s->words.size());
    std::vector<Tensor> xs, masks, tags;
    for (size_t i = 0; i < longest; ++i) {
      std::vector<int64_t> words, tag;
      std::vector<float> mask;
      for (const Sentence* s : batch) {
        const bool inside = i < s->words.size();
        words.push_back(inside ? s->words[i] : 0);
        tag.push_back(inside ? s->tags[i] : 0);
        mask.push_back(inside ? 1.0f : 0.0f);
      }
      xs.push_back(embed(from_vector(words, {k})));
      tags.push_back(from_vector(tag, {k}));
      masks.push_back(from_vector(mask, {k, 1}));
    }
    const auto [hf, hb] = hidden_states(xs, k, masks);
    Tensor total;
    for (size_t i = 0; i < longest; ++i) {
      Tensor l = sum(nll_per_row(tag_logits(hf[i], hb[i]), tags[i]) * reshape(masks[i], {k}));
      total = total.defined() ? total + l : l;
    }
    return total;
  }
};

// Greedy decoding with an LSTM: the state starts from an input vector; each step feeds the
// last token back and takes the highest-scoring next one, until token 0 or `limit` tokens.
struct GreedyDecoder {
  LstmCell cell;
  Tensor embedding, init_w, out_w, out_b;
  int64_t hidden, limit;
  // end_bias: added to token 0's score, so sequences end at many different lengths.
  GreedyDecoder(int64_t in, int64_t embedding_dim, int64_t hidden_size, int64_t vocabulary,
                float end_bias, int64_t max_tokens, Generator& g)
      : cell(embedding_dim, hidden_size, g),
        embedding(uniform_parameter({vocabulary, embedding_dim}, 1.0, g)),
        init_w(uniform_parameter({hidden_size, in}, 1.0, g)),
        out_w(uniform_parameter({vocabulary, hidden_size}, 1.0, g)),
        out_b(zeros({vocabulary})),
        hidden(hidden_size),
        limit(max_tokens) {
    out_b.data<float>()[0] = end_bias;
  }
  Tensor initial(const Tensor& x) const { return tanh(matmul(x, transpose(init_w, 0, 1))); }
  std::vector<Tensor> step(const Tensor& tokens, const Tensor& h, const Tensor& c) const {
    return cell.step(pipit::embedding(embedding, tokens), h, c);
  }
  Tensor scores(const Tensor& h) const { return matmul(h, transpose(out_w, 0, 1)) + out_b; }

  // One example at a time.
  std::vector<int64_t> decode(const Tensor& x) const {
    Tensor h = initial(reshape(x, {1, x.size(0)})), c = zeros({1, hidden});
    int64_t token = 1;
    std::vector<int64_t> tokens;
    while (static_cast<int64_t>(tokens.size()) < limit) {
      auto next = step(from_vector<int64_t>({token}, {1}), h, c);
      h = next[0];
      c = next[1];
      token = argmax(scores(h), 1).to_vector<int64_t>()[0];
      if (token == 0) break;
      tokens.push_back(token);
    }
    return tokens;
  }

  struct Ops {
    batching::Batched<1> initial;
    batching::Batched<2> step;
    batching::Batched<1> next_token;  // the highest-scoring token, i64
  };
  Ops batched() const {
    return {
        batching::batched_fn("initial", [this](const Tensor& x) { return initial(x); }),
        batching::batched_fn<2>(
            "step", [this](const std::vector<Tensor>& in) { return step(in[0], in[1], in[2]); }),
        batching::batched_fn("next_token",
                             [this](const Tensor& h) { return argmax(scores(h), 1); })};
  }
  // The same decoding as a coroutine: run it with batching::run_examples.
  batching::Example decode_example(const Ops& ops, Tensor x, std::vector<int64_t>& tokens) const {
    Handle h = ops.initial(batching::batched_value(x));
    Handle c = batching::batched_value(zeros({hidden}));
    Handle token = batched_index(1);
    while (static_cast<int64_t>(tokens.size()) < limit) {
      auto [next_h, next_c] = ops.step(token, h, c);
      token = ops.next_token(next_h);  // stays in the graph: the next step reads it there
      const int64_t chosen = (co_await token).item<int64_t>();
      if (chosen == 0) co_return;
      tokens.push_back(chosen);
      h = next_h;
      c = next_c;
    }
  }
};

struct TreeLstmBatched {
  batching::Batched<2> leaf, compose;
  batching::Batched<1> loss;
  explicit TreeLstmBatched(const TreeLstm& m)
      : leaf(batching::batched_fn<2>(
            "leaf", [&m](const std::vector<Tensor>& in) { return m.leaf(in[0]); })),
        compose(batching::batched_fn<2>(
            "compose",
            [&m](const std::vector<Tensor>& in) { return m.compose(in[0], in[1], in[2], in[3]); })),
        loss(batching::batched_fn("loss", [&m](const Tensor& h, const Tensor& label) {
          return nll_per_row(m.logits(h), label);
        })) {}
  // The tree's root state h, deferred.
  Handle encode(const Tree& tree) const {
    std::vector<std::array<Handle, 2>> state(tree.nodes.size());
    for (size_t i = 0; i < tree.nodes.size(); ++i) {
      const Tree::Node& n = tree.nodes[i];
      if (n.left < 0) {
        state[i] = leaf(batched_index(n.word));
      } else {
        const auto& l = state[static_cast<size_t>(n.left)];
        const auto& r = state[static_cast<size_t>(n.right)];
        state[i] = compose(l[0], l[1], r[0], r[1]);
      }
    }
    return state.back()[0];
  }
  // The tree's loss, deferred.
  Handle operator()(const Tree& tree) const {
    return loss(encode(tree), batched_index(tree.label));
  }
};

struct BiLstmBatched {
  const BiLstmTagger& m;
  batching::Batched<1> embed, logits_loss;
  batching::Batched<2> forward_step, backward_step;
  explicit BiLstmBatched(const BiLstmTagger& model)
      : m(model),
        embed(batching::batched_fn("embed", [&model](const Tensor& w) { return model.embed(w); })),
        logits_loss(batching::batched_fn("tag_loss",
                                         [&model](const std::vector<Tensor>& in) {
                                           return std::vector<Tensor>{
                                               nll_per_row(model.tag_logits(in[0], in[1]), in[2])};
                                         })),
        forward_step(batching::batched_fn<2>("forward_lstm",
                                             [&model](const std::vector<Tensor>& in) {
                                               return model.forward_cell.step(in[0], in[1], in[2]);
                                             })),
        backward_step(
            batching::batched_fn<2>("backward_lstm", [&model](const std::vector<Tensor>& in) {
              return model.backward_cell.step(in[0], in[1], in[2]);
            })) {}
  // Every word's loss, deferred.
  std::vector<Handle> operator()(const Sentence& s, const Handle& zero_state) const {
    const size_t n = s.words.size();
    std::vector<Handle> xs, hf(n), hb(n), losses;
    for (int64_t w : s.words) xs.push_back(embed(batched_index(w)));
    Handle h = zero_state, c = zero_state;
    for (size_t i = 0; i < n; ++i) {
      auto [next_h, next_c] = forward_step(xs[i], h, c);
      h = hf[i] = next_h;
      c = next_c;
    }
    h = zero_state;
    c = zero_state;
    for (size_t i = n; i-- > 0;) {
      auto [next_h, next_c] = backward_step(xs[i], h, c);
      h = hb[i] = next_h;
      c = next_c;
    }
    for (size_t i = 0; i < n; ++i)
      losses.push_back(logits_loss(hf[i], hb[i], batched_index(s.tags[i])));
    return losses;
  }
};

}  // namespace pipit::support
