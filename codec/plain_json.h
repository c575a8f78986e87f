#pragma once
// Pieces for writing and reading JSON of one known shape without the JSON library (the
// plain safetensors header, a frame's JSON header): integers exactly as the library writes
// them, and a reader that consumes what it expects from the front of `text` or says no,
// leaving the caller to hand the text to the library instead.
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace pipit::plain_json {

template <typename Integer>
void put_integer(std::string& out, Integer value) {
  char digits[24];
  out.append(digits, std::to_chars(digits, digits + sizeof digits, value).ptr);
}

inline bool take_literal(std::string_view& text, std::string_view literal) {
  if (!text.starts_with(literal)) return false;
  text.remove_prefix(literal.size());
  return true;
}

// An integer as the library writes one ("0", or digits without a leading zero, after a
// minus for a signed Integer), within [min, max].
template <typename Integer>
bool take_integer(std::string_view& text, Integer min, Integer max, Integer* value) {
  const size_t sign = text.starts_with('-') ? 1 : 0;
  if (text.size() <= sign || text[sign] < '0' || text[sign] > '9') return false;
  if (text[sign] == '0' && (sign == 1 || (text.size() > 1 && text[1] >= '0' && text[1] <= '9'))) {
    return false;
  }
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  if (error != std::errc() || *value < min || *value > max) return false;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return true;
}

}  // namespace pipit::plain_json
