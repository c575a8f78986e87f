#pragma once
// train_gpt's held-out data: the tokens its validation loss is computed on.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "codec/atomic_file.h"
#include "support/flags.h"
#include "text/tokenizer.h"
#include "text_data.h"

namespace samples::train_gpt {

// --val-tokens FILE, --val-data FILE (tokenized as the training text: by `tokenizer`, or by
// `chars`), or the last --val-fraction of `tokens`, which are then cut off it so that the run
// never trains on them. Each token must lie in the vocabulary, and there must be at least
// context + 1 of them; empty: no validation. Errors name the flag.
inline std::vector<int64_t> held_out_tokens(const pipit::support::Flags& flags,
                                            std::vector<int64_t>& tokens, const Vocabulary* chars,
                                            const pipit::text::Tokenizer* tokenizer, int64_t steps,
                                            int64_t context, int64_t vocab_size) {
  std::vector<int64_t> val_tokens;
  if (!flags.str("val-tokens").empty()) {
    val_tokens = read_token_ids(flags.str("val-tokens"), static_cast<size_t>(vocab_size));
  } else if (!flags.str("val-data").empty()) {
    const std::string text = pipit::read_file(flags.str("val-data"));
    if (tokenizer) {
      for (const uint32_t id : tokenizer->encode(text)) val_tokens.push_back(id);
    } else if (chars) {
      val_tokens = chars->encode(text);
      if (const auto unknown = std::ranges::find(val_tokens, -1); unknown != val_tokens.end()) {
        flags.fail("--val-data holds a character (byte " +
                   std::to_string(static_cast<unsigned char>(
                       text[static_cast<size_t>(unknown - val_tokens.begin())])) +
                   ") the training text does not have");
      }
    } else {
      flags.fail("--val-data needs a tokenizer: give --tokenizer DIR or --val-tokens FILE");
    }
  } else if (steps > 0 && flags.number("val-fraction") > 0) {
    const double fraction = flags.number("val-fraction");
    if (!(fraction < 1)) flags.fail("--val-fraction must be in [0, 1)");
    const auto held_out = static_cast<size_t>(static_cast<double>(tokens.size()) * fraction);
    val_tokens.assign(tokens.end() - static_cast<int64_t>(held_out), tokens.end());
    tokens.resize(tokens.size() - held_out);
    if (tokens.size() < static_cast<size_t>(context) + 2) {
      flags.fail("--val-fraction " + flags.str("val-fraction") + " leaves " +
                 std::to_string(tokens.size()) + " tokens to train on; they must be more " +
                 "than --context + 1 (give --val-fraction 0 for no validation)");
    }
  }
  for (const int64_t id : val_tokens) {
    if (id < 0 || id >= vocab_size) {
      flags.fail("the validation data has a token (id " + std::to_string(id) +
                 ") outside the training text's vocabulary of " + std::to_string(vocab_size));
    }
  }
  if (!val_tokens.empty() && val_tokens.size() < static_cast<size_t>(context) + 1) {
    flags.fail("the validation data has " + std::to_string(val_tokens.size()) +
               " tokens; it needs at least --context + 1 (or --val-fraction 0: no validation)");
  }
  return val_tokens;
}

}  // namespace samples::train_gpt
