#pragma once
// GPT-2's byte-to-unicode map: vocab.json and merges.txt spell each byte of a token as one
// printable character (the byte itself for '!'..'~', '¡'..'¬', '®'..'ÿ'; U+0100 onwards, in
// byte order, for the rest, so that a space is 'Ġ' and a newline 'Ċ'). pipit works on the
// bytes and converts only when reading or writing those files.
#include <optional>
#include <string>
#include <string_view>

namespace pipit::text {

// The code point that spells `byte`.
char32_t byte_to_char(unsigned char byte);

// A token's bytes spelled in the map's characters, as UTF-8.
std::string bytes_to_spelling(std::string_view bytes);

// The bytes a spelling stands for; nullopt when it is not valid UTF-8 or holds a character
// outside the map's 256.
std::optional<std::string> spelling_to_bytes(std::string_view spelling);

}  // namespace pipit::text
