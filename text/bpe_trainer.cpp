#include "text/bpe_trainer.h"

#include <algorithm>
#include <queue>

#include "text/byte_level.h"
#include "text/error.h"
#include "text/pretokenizer.h"

namespace pipit::text {
namespace {

using Pair = uint64_t;  // left id << 32 | right id: ordered as HF orders pairs on ties

constexpr Pair make_pair(uint32_t left, uint32_t right) {
  return (Pair{left} << 32) | right;
}

struct Candidate {
  uint64_t count;
  Pair pair;
  // The queue's top is the largest: the highest count, then the smallest pair.
  bool operator<(const Candidate& other) const {
    return count != other.count ? count < other.count : pair > other.pair;
  }
};

// The corpus's distinct pieces as id sequences, with the pair statistics over them.
struct Corpus {
  std::vector<std::vector<uint32_t>> words;
  std::vector<uint64_t> counts;
  std::unordered_map<Pair, int64_t> pair_counts;
  std::unordered_map<Pair, std::vector<uint32_t>> where;  // pair -> words holding it (maybe twice)
  std::vector<Pair> grown;                                // pairs whose count rose in a merge

  void change(Pair pair, int64_t delta, uint32_t word) {
    pair_counts[pair] += delta;
    if (delta > 0) {
      where[pair].push_back(word);
      grown.push_back(pair);
    }
  }

  // Replaces every (left, right) in word w by `result`, left to right, updating the counts
  // of the pairs around each replacement.
  void merge(uint32_t w, uint32_t left, uint32_t right, uint32_t result) {
    std::vector<uint32_t>& s = words[w];
    const auto count = static_cast<int64_t>(counts[w]);
    std::vector<uint32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        if (!out.empty()) {
          change(make_pair(out.back(), left), -count, w);
          change(make_pair(out.back(), result), count, w);
        }
        if (i + 2 < s.size()) {
          change(make_pair(right, s[i + 2]), -count, w);
          change(make_pair(result, s[i + 2]), count, w);
        }
        out.push_back(result);
        i += 2;
      } else {
        out.push_back(s[i++]);
      }
    }
    s = std::move(out);
  }
};

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : options_(std::move(options)) {}

void BpeTrainer::add_text(std::string_view text) {
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size() - 1) + 1;
    pretokenize(text.substr(begin, end - begin),
                [&](std::string_view piece) { ++counts_[std::string(piece)]; });
    begin = end;
  }
}

void BpeTrainer::add_file(const std::string& path) {
  add_text(read_text_file(path));
}

namespace {

// The model being trained, and each token's id by its bytes.
struct Vocabulary {
  BpeModel model;
  std::unordered_map<std::string, uint32_t> ids;

  uint32_t add(std::string bytes) {
    const auto id = static_cast<uint32_t>(model.tokens.size());
    ids.emplace(bytes, id);
    model.tokens.push_back(std::move(bytes));
    return id;
  }
  // The specials, then the 256 bytes; returns each byte's id.
  std::vector<uint32_t> add_alphabet(const std::vector<std::string>& specials) {
    for (const std::string& special : specials) model.specials.push_back(add(special));
    // HF numbers the alphabet in the order of the characters that spell the bytes.
    std::vector<int> bytes(256);
    for (int b = 0; b < 256; ++b) bytes[b] = b;
    std::sort(bytes.begin(), bytes.end(), [](int a, int b) {
      return byte_to_char(static_cast<unsigned char>(a)) <
             byte_to_char(static_cast<unsigned char>(b));
    });
    std::vector<uint32_t> byte_id(256);
    for (const int b : bytes) byte_id[b] = add(std::string(1, static_cast<char>(b)));
    return byte_id;
  }
};

// Every piece spelled in byte tokens, with its pairs counted; in a fixed order, so that
// training does not depend on the hash map's.
Corpus corpus_of(const std::unordered_map<std::string, uint64_t>& counts,
                 const std::vector<uint32_t>& byte_id) {
  std::vector<std::pair<std::string, uint64_t>> pieces(counts.begin(), counts.end());
  std::sort(pieces.begin(), pieces.end());
  Corpus corpus;
  for (const auto& [piece, count] : pieces) {
    const auto w = static_cast<uint32_t>(corpus.words.size());
    std::vector<uint32_t>& word = corpus.words.emplace_back();
    for (const char c : piece) word.push_back(byte_id[static_cast<unsigned char>(c)]);
    corpus.counts.push_back(count);
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      corpus.change(make_pair(word[i], word[i + 1]), static_cast<int64_t>(count), w);
    }
  }
  return corpus;
}

// The pairs whose counts grew since the last push, queued with their counts.
void push_grown(Corpus& corpus, std::priority_queue<Candidate>& queue) {
  std::sort(corpus.grown.begin(), corpus.grown.end());
  corpus.grown.erase(std::unique(corpus.grown.begin(), corpus.grown.end()), corpus.grown.end());
  for (const Pair pair : corpus.grown) {
    if (const int64_t count = corpus.pair_counts[pair]; count > 0) {
      queue.push({static_cast<uint64_t>(count), pair});
    }
  }
  corpus.grown.clear();
}

}  // namespace

BpeModel BpeTrainer::train(const std::function<void(size_t, size_t)>& on_progress) const {
  const size_t base = options_.specials.size() + 256;
  if (options_.vocab_size < base) {
    throw TextError("BPE trainer: a vocabulary of " + std::to_string(options_.vocab_size) +
                    " tokens has no room for " + std::to_string(options_.specials.size()) +
                    " special tokens and the 256 bytes");
  }
  Vocabulary vocabulary;
  Corpus corpus = corpus_of(counts_, vocabulary.add_alphabet(options_.specials));
  std::priority_queue<Candidate> queue;
  push_grown(corpus, queue);
  BpeModel& model = vocabulary.model;
  std::vector<uint32_t> seen(corpus.words.size(), UINT32_MAX);  // merge number per word
  const uint64_t min_count = std::max<uint64_t>(1, options_.min_frequency);
  while (model.tokens.size() < options_.vocab_size && !queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int64_t current = corpus.pair_counts[top.pair];
    // Counts only fall between pushes, except through a fresh push: an entry whose count is
    // out of date goes back with today's.
    if (current != static_cast<int64_t>(top.count)) {
      if (current > 0) queue.push({static_cast<uint64_t>(current), top.pair});
      continue;
    }
    if (top.count < min_count) break;
    const auto left = static_cast<uint32_t>(top.pair >> 32);
    const auto right = static_cast<uint32_t>(top.pair);
    std::string merged = model.tokens[left] + model.tokens[right];
    const auto known = vocabulary.ids.find(merged);
    const uint32_t result =
        known != vocabulary.ids.end() ? known->second : vocabulary.add(std::move(merged));
    const auto number = static_cast<uint32_t>(model.merges.size());
    model.merges.push_back({left, right, result});
    const std::vector<uint32_t> holders = std::move(corpus.where[top.pair]);
    corpus.where.erase(top.pair);
    for (const uint32_t w : holders) {
      if (seen[w] == number) continue;
      seen[w] = number;
      corpus.merge(w, left, right, result);
    }
    corpus.pair_counts[top.pair] = 0;
    push_grown(corpus, queue);
    if (on_progress) on_progress(model.tokens.size(), options_.vocab_size);
  }
  return std::move(vocabulary.model);
}

}  // namespace pipit::text
