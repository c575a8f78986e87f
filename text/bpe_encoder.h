#pragma once
// Applies a model's merges to one pre-tokenized piece: repeatedly merges the adjacent pair of
// lowest rank (leftmost first), as GPT-2 and Hugging Face tokenizers do. A pair's rank is one
// hash lookup; pieces longer than a few dozen bytes go through a heap of candidate pairs
// over a linked list of symbols, so a piece of n bytes costs O(n log n), not O(n^2).
#include <cstdint>
#include <string_view>
#include <vector>

#include "text/bpe_model.h"

namespace pipit::text {

class BpeEncoder {
 public:
  // Throws TextError when a byte has no token of its own (nothing could encode it).
  explicit BpeEncoder(const BpeModel& model, std::string_view source);

  // Appends the ids of `piece` (non-empty bytes) to out.
  void encode(std::string_view piece, std::vector<uint32_t>& out) const;

  uint32_t byte_id(unsigned char byte) const { return byte_ids_[byte]; }

 private:
  struct Rank {
    uint32_t rank, result;
  };
  // An open-addressing table from (left, right) to its rank and result.
  struct Slot {
    uint64_t key;
    Rank value;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  const Rank* find(uint32_t left, uint32_t right) const;
  void encode_short(std::string_view piece, std::vector<uint32_t>& out) const;
  void encode_long(std::string_view piece, std::vector<uint32_t>& out) const;

  uint32_t byte_ids_[256];
  std::vector<Slot> slots_;
  int shift_ = 64;
};

}  // namespace pipit::text
