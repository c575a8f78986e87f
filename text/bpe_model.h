#pragma once
// A byte-level BPE model as data: every token's bytes by id, and the merges in rank order.
// The files' readers (vocab_files.h) and the trainer (bpe_trainer.h) make one; BpeEncoder
// and Tokenizer use it.
#include <cstdint>
#include <string>
#include <vector>

namespace pipit::text {

struct BpeMerge {
  uint32_t left, right, result;  // token ids: left + right -> result
};

struct BpeModel {
  std::vector<std::string> tokens;  // id -> the token's bytes
  std::vector<BpeMerge> merges;     // rank order: merges[0] applies first
  std::vector<uint32_t> specials;   // ids matched whole in the raw text (e.g. <|endoftext|>)
  // tokenizer.json's "ignore_merges": a piece that is itself a token is taken whole.
  bool ignore_merges = false;
};

}  // namespace pipit::text
