#include "text/bpe_encoder.h"

#include <bit>
#include <queue>
#include <string>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/error.h"

namespace pipit::text {
namespace {

constexpr uint64_t pair_key(uint32_t left, uint32_t right) {
  return (uint64_t{left} << 32) | right;
}

// Past this many bytes a piece takes the heap; below it a scan of all pairs per merge is
// faster (no allocation, a handful of symbols).
constexpr size_t kShortPiece = 48;

}  // namespace

BpeEncoder::BpeEncoder(const BpeModel& model, std::string_view source) {
  std::unordered_map<std::string, uint32_t> ids;
  for (uint32_t id = 0; id < model.tokens.size(); ++id) ids.emplace(model.tokens[id], id);
  for (int byte = 0; byte < 256; ++byte) {
    const auto it = ids.find(std::string(1, static_cast<char>(byte)));
    if (it == ids.end()) {
      throw TextError(std::string(source) + ": byte " + std::to_string(byte) + " ('" +
                      bytes_to_spelling(std::string(1, static_cast<char>(byte))) +
                      "') has no token of its own, so some texts could not be encoded");
    }
    byte_ids_[byte] = it->second;
  }
  size_t capacity = 16;
  while (capacity < model.merges.size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{kEmpty, {}});
  shift_ = 64 - std::countr_zero(capacity);
  // Where a pair is listed twice the later rank wins, as in Hugging Face tokenizers, whose
  // merge map is built by inserting the list in order.
  for (uint32_t rank = 0; rank < model.merges.size(); ++rank) {
    const BpeMerge& merge = model.merges[rank];
    const uint64_t key = pair_key(merge.left, merge.right);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & (capacity - 1);
    slots_[i] = {key, {rank, merge.result}};
  }
}

const BpeEncoder::Rank* BpeEncoder::find(uint32_t left, uint32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & (slots_.size() - 1)) {
    if (slots_[i].key == key) return &slots_[i].value;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

void BpeEncoder::encode(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.size() <= kShortPiece) {
    encode_short(piece, out);
  } else {
    encode_long(piece, out);
  }
}

void BpeEncoder::encode_short(std::string_view piece, std::vector<uint32_t>& out) const {
  uint32_t symbols[kShortPiece];
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) symbols[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  while (n > 1) {
    const Rank* best = nullptr;
    size_t at = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      const Rank* rank = find(symbols[i], symbols[i + 1]);
      if (rank && (!best || rank->rank < best->rank)) best = rank, at = i;
    }
    if (!best) break;
    symbols[at] = best->result;
    for (size_t i = at + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
    --n;
  }
  out.insert(out.end(), symbols, symbols + n);
}

void BpeEncoder::encode_long(std::string_view piece, std::vector<uint32_t>& out) const {
  const size_t n = piece.size();
  std::vector<uint32_t> symbol(n);
  // A doubly linked list over the symbols still standing; merged-away ones have size 0.
  std::vector<size_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    symbol[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;  // wraps for i = 0: no predecessor
    next[i] = i + 1;  // n: no successor
  }
  struct Candidate {
    uint32_t rank;
    size_t at;  // the left symbol's position
    uint32_t left, right;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : at > other.at;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](size_t at) {
    if (at >= n || next[at] >= n) return;
    if (const Rank* rank = find(symbol[at], symbol[next[at]])) {
      heap.push({rank->rank, at, symbol[at], symbol[next[at]]});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    // Stale: one of its symbols was merged into something else since it was pushed.
    const size_t right = next[top.at];
    if (!alive[top.at] || right >= n || symbol[top.at] != top.left || symbol[right] != top.right) {
      continue;
    }
    symbol[top.at] = find(top.left, top.right)->result;
    alive[right] = 0;
    next[top.at] = next[right];
    if (next[right] < n) prev[next[right]] = top.at;
    if (prev[top.at] < n) consider(prev[top.at]);
    consider(top.at);
  }
  for (size_t i = 0; i < n; i = next[i]) out.push_back(symbol[i]);
}

}  // namespace pipit::text
