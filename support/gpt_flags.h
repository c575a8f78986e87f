#pragma once
// The flags that shape a GPT, declared once for every program that builds one (train_gpt,
// train_ps, the chaos trainer, the GPT benchmarks): --layers, --heads, --width, --context and
// --vocab-multiple; and, where the vocabulary is not the data's, --vocab and --tied.
#include <string>

#include "nn/builders.h"
#include "support/flags.h"

namespace pipit::support {

// GPT-2 small, the benchmarks' model: 12 blocks of width 768 with 12 heads, 1024 positions and
// 50257 tokens, its head padded to a multiple of `vocab_multiple`.
inline GptConfig gpt2_small(int64_t vocab_multiple) {
  return {.vocab_size = 50257,
          .context = 1024,
          .layers = 12,
          .heads = 12,
          .width = 768,
          .vocab_multiple = vocab_multiple};
}

// Where the model's vocabulary comes from: the program's data, or the --vocab flag.
enum class GptVocabulary { from_data, from_flag };

// The flags, their defaults `defaults`' fields.
inline void add_gpt_flags(Flags& flags, const GptConfig& defaults, GptVocabulary vocabulary) {
  flags.add("layers", std::to_string(defaults.layers), "transformer blocks");
  flags.add("heads", std::to_string(defaults.heads), "attention heads");
  flags.add("width", std::to_string(defaults.width), "embedding width");
  flags.add("context", std::to_string(defaults.context), "tokens per sequence");
  flags.add("vocab-multiple", std::to_string(defaults.vocab_multiple),
            "pad the head's logits to a multiple of this (64 or 128: GEMM sizes tensor cores "
            "like, as llm.c pads GPT-2's; the loss and sampling ignore the padding)");
  if (vocabulary == GptVocabulary::from_data) return;
  flags.add("vocab", std::to_string(defaults.vocab_size), "vocabulary size");
  flags.add_switch("tied",
                   "GPT-2's head: the token embedding's table, no bias (as llm.c and Hugging "
                   "Face); else a head of its own");
}

// The GptConfig the flags give; with GptVocabulary::from_data its vocab_size is the caller's to
// set. --context may be 0 for a program that reads it as "pick one".
inline GptConfig gpt_config(const Flags& flags) {
  GptConfig config;
  config.layers = flags.integer("layers");
  config.heads = flags.integer("heads");
  config.width = flags.integer("width");
  config.context = flags.integer("context", 0);
  config.vocab_multiple = flags.integer("vocab-multiple");
  if (config.width % config.heads != 0) flags.fail("--width must be a multiple of --heads");
  if (!flags.has("vocab")) return config;
  config.vocab_size = flags.integer("vocab");
  config.tie_embeddings = flags.on("tied");
  config.head_bias = !config.tie_embeddings;
  return config;
}

}  // namespace pipit::support
