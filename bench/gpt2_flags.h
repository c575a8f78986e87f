#pragma once
// The flags of the benchmarks that build a GPT (GPT-2 small unless told): --layers, --heads,
// --width, --context, --vocab, --vocab-multiple and --tied, and the GptConfig they give.
#include "nn/builders.h"
#include "support/flags.h"

namespace pipit::bench {

inline void add_gpt2_flags(samples::Flags& flags, const char* vocab_multiple) {
  flags.add("layers", "12", "transformer blocks");
  flags.add("heads", "12", "attention heads");
  flags.add("width", "768", "model width");
  flags.add("context", "1024", "tokens per sequence");
  flags.add("vocab", "50257", "vocabulary size");
  flags.add("vocab-multiple", vocab_multiple,
            "pad the head's logits to a multiple of this (llm.c: 64)");
  flags.add_switch("tied",
                   "GPT-2's head: the token embedding's table, no bias (as llm.c and Hugging "
                   "Face); else a head of its own");
}

inline GptConfig gpt2_config(const samples::Flags& flags) {
  GptConfig config;
  config.layers = flags.integer("layers");
  config.heads = flags.integer("heads");
  config.width = flags.integer("width");
  config.context = flags.integer("context");
  config.vocab_size = flags.integer("vocab");
  config.vocab_multiple = flags.integer("vocab-multiple");
  config.tie_embeddings = flags.on("tied");
  config.head_bias = !config.tie_embeddings;
  return config;
}

}  // namespace pipit::bench
