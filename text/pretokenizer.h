#pragma once
// GPT-2's pre-tokenizer, written out by hand instead of run through a regex engine:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The alternatives are tried in order at each position, as the regex would, and each piece
// costs time linear in its length (the regex's backtracking \s+(?!\S) is one step back here),
// so a megabyte of spaces or letters is one pass.
#include <cstddef>
#include <string_view>

namespace pipit::text {

// The end of the piece that starts at `pos` (< text.size()).
size_t next_piece(std::string_view text, size_t pos);

// Calls emit(piece) for every piece of `text`, in order; the pieces concatenate to `text`.
template <typename Emit>
void pretokenize(std::string_view text, Emit&& emit) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = next_piece(text, pos);
    emit(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace pipit::text
