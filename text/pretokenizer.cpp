#include "text/pretokenizer.h"

#include "text/unicode.h"

namespace pipit::text {
namespace {

// The end of the run of units of class `cls` that starts at pos.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const Unit unit = unit_at(text, pos);
    if (unit.cls != cls) break;
    pos += unit.size;
  }
  return pos;
}

// 's 't 'm 'd 're 've 'll: the length of the contraction at pos, or 0.
size_t contraction(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
}

}  // namespace

size_t next_piece(std::string_view text, size_t pos) {
  if (const size_t size = contraction(text, pos)) return pos + size;
  const Unit unit = unit_at(text, pos);
  if (unit.cls != CharClass::space) return run_end(text, pos + unit.size, unit.cls);
  // " ?\p{L}+", " ?\p{N}+" and " ?[^\s\p{L}\p{N}]+" take one leading space (U+0020 only).
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const Unit next = unit_at(text, pos + 1);
    if (next.cls != CharClass::space) return run_end(text, pos + 1 + next.size, next.cls);
  }
  // "\s+(?!\S)": the whitespace run, less its last character when something follows it, so
  // that a space can lead the next word; "\s+" when that would leave nothing.
  size_t last = pos;
  size_t end = pos;
  while (end < text.size()) {
    const Unit next = unit_at(text, end);
    if (next.cls != CharClass::space) break;
    last = end;
    end += next.size;
  }
  return end == text.size() || last == pos ? end : last;
}

}  // namespace pipit::text
