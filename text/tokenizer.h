#pragma once
// GPT-2's byte-level BPE tokenizer: special tokens are matched whole in the raw text first,
// the rest is pre-tokenized (pretokenizer.h) and each piece's bytes are merged (bpe_encoder.h).
// Any byte string encodes, and decode(encode(s)) == s, invalid UTF-8 included: its bytes are
// tokens like any other. Ids and merges agree with Hugging Face tokenizers' ByteLevel BPE
// (add_prefix_space false) on the same files.
//
// encode and decode may be called from several threads at once: pieces seen before come
// from a cache shared under a mutex.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe_encoder.h"
#include "text/bpe_model.h"
#include "text/vocab_files.h"

namespace pipit::text {

class Tokenizer {
 public:
  explicit Tokenizer(BpeModel model, std::string_view source = "tokenizer");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // DIR/tokenizer.json when there is one, else DIR/vocab.json and DIR/merges.txt (whose
  // special tokens are `specials`).
  static Tokenizer from_directory(const std::string& dir,
                                  const std::vector<std::string>& specials = kDefaultSpecials);

  std::vector<uint32_t> encode(std::string_view text) const;
  // Appends to out.
  void encode(std::string_view text, std::vector<uint32_t>& out) const;
  // The same ids, encoded in pieces of about `chunk` bytes cut where the pre-tokenizer cuts
  // anyway (a lone '\n' between two visible ASCII characters), with `on_progress(bytes done)`
  // after each: a progress line's input for texts of gigabytes.
  void encode(std::string_view text, std::vector<uint32_t>& out,
              const std::function<void(size_t)>& on_progress, size_t chunk = size_t{1} << 20) const;
  // Throws TextError naming the first id that is not in the vocabulary.
  std::string decode(std::span<const uint32_t> ids) const;

  size_t vocab_size() const { return model_.tokens.size(); }
  const BpeModel& model() const { return model_; }
  // The id of the token whose bytes are `bytes`, if there is one.
  std::optional<uint32_t> token_id(std::string_view bytes) const;

 private:
  struct State;
  void encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;

  BpeModel model_;
  std::unique_ptr<State> state_;
};

}  // namespace pipit::text
