#pragma once
// The character classes GPT-2's pre-tokenizer pattern names (\p{L}, \p{N}, \s), and a
// decoder that reads UTF-8 one unit at a time, an invalid byte being a unit of its own.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pipit::text {

enum class CharClass : uint8_t { letter, number, space, other };

// Unicode's General_Category L* and N*, from the tables in unicode_tables.cpp (generated).
bool is_letter_slow(char32_t cp);
bool is_number_slow(char32_t cp);
// Unicode's White_Space property, which is what the pattern's \s matches (Oniguruma, as used
// by Hugging Face tokenizers, and Python's regex module agree); unlike str.isspace(), it
// leaves out U+001C..U+001F.
bool is_space(char32_t cp);
CharClass classify(char32_t cp);

struct Unit {
  CharClass cls;
  uint8_t size;  // bytes, 1..4
};

// The unit at text[pos] (pos < text.size()): a well-formed UTF-8 sequence (no overlongs,
// surrogates or values past U+10FFFF) is one character; any other byte is a unit of class
// `other` by itself, so that every byte string pre-tokenizes and round-trips.
Unit unit_at(std::string_view text, size_t pos);

// `bytes` made valid UTF-8 for display: each maximal ill-formed part (a stray byte, a
// sequence cut short, as at the end of a sample that stops inside a character) becomes one
// U+FFFD, Unicode's recommended practice, which Hugging Face tokenizers' decode (Rust's
// from_utf8_lossy) and Python's decode(errors="replace") follow. Valid text is unchanged.
std::string valid_utf8(std::string_view bytes);

}  // namespace pipit::text
