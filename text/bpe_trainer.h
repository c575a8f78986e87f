#pragma once
// Learns a byte-level BPE from text as Hugging Face tokenizers' BpeTrainer does for a
// ByteLevel BPE (initial alphabet: all 256 bytes; special tokens first): the text is read as
// HF reads a training file, line by line with each line's '\n', pre-tokenized with GPT-2's
// pattern and counted; then, until the vocabulary reaches its size, the most frequent
// adjacent pair (ties: the pair of smaller ids) is merged everywhere. Pair counts are kept
// up to date incrementally, so each merge costs the words it touches, not the corpus.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/bpe_model.h"
#include "text/vocab_files.h"

namespace pipit::text {

struct BpeTrainerOptions {
  size_t vocab_size = 50257;  // specials + 256 bytes + merges
  std::vector<std::string> specials = kDefaultSpecials;
  uint64_t min_frequency = 0;  // a pair seen fewer times is never merged
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options);

  // Counts the pieces of `text`, cut into lines as a file holding it would be.
  void add_text(std::string_view text);
  void add_file(const std::string& path);

  // Throws TextError when vocab_size leaves no room for the specials and the 256 bytes.
  // `on_progress(tokens, vocab_size)`, when given, hears of the vocabulary's growth after each
  // merge (a progress line's input; it does not change the result).
  BpeModel train(const std::function<void(size_t, size_t)>& on_progress = {}) const;

 private:
  BpeTrainerOptions options_;
  std::unordered_map<std::string, uint64_t> counts_;  // piece -> occurrences
};

}  // namespace pipit::text
