#include "text/unicode.h"

#include <algorithm>
#include <array>

namespace pipit::text {
namespace {

constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool space = c == ' ' || (c >= 0x09 && c <= 0x0D);
    classes[c] = letter                 ? CharClass::letter
                 : c >= '0' && c <= '9' ? CharClass::number
                 : space                ? CharClass::space
                                        : CharClass::other;
  }
  return classes;
}

constexpr std::array<CharClass, 128> kAscii = ascii_classes();

}  // namespace

bool is_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

CharClass classify(char32_t cp) {
  if (cp < 128) return kAscii[cp];
  if (is_space(cp)) return CharClass::space;
  if (is_letter_slow(cp)) return CharClass::letter;
  if (is_number_slow(cp)) return CharClass::number;
  return CharClass::other;
}

Unit unit_at(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {kAscii[lead], 1};
  const size_t size = lead >= 0xC2 && lead <= 0xDF   ? 2
                      : lead >= 0xE0 && lead <= 0xEF ? 3
                      : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                     : 0;
  if (size == 0 || pos + size > text.size()) return {CharClass::other, 1};
  char32_t cp = lead & (0x7F >> size);
  for (size_t i = 1; i < size; ++i) {
    const uint8_t next = byte(pos + i);
    if ((next & 0xC0) != 0x80) return {CharClass::other, 1};
    cp = (cp << 6) | (next & 0x3F);
  }
  const char32_t smallest = size == 2 ? 0x80 : size == 3 ? 0x800 : 0x10000;
  if (cp < smallest || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return {CharClass::other, 1};
  }
  return {classify(cp), static_cast<uint8_t>(size)};
}

std::string valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out += bytes[i++];
      continue;
    }
    // The sequence's length and its second byte's range (Unicode's Table 3-7 of well-formed
    // sequences: no overlongs, surrogates or values past U+10FFFF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) length = 2;
    if (lead >= 0xe0 && lead <= 0xef) length = 3;
    if (lead >= 0xf0 && lead <= 0xf4) length = 4;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
    size_t valid = length == 0 ? 0 : 1;  // the lead and the continuation bytes that fit
    while (valid > 0 && valid < length && i + valid < bytes.size()) {
      const auto next = static_cast<unsigned char>(bytes[i + valid]);
      if (next < (valid == 1 ? low : 0x80) || next > (valid == 1 ? high : 0xbf)) break;
      ++valid;
    }
    if (length > 0 && valid == length) {
      out.append(bytes.substr(i, length));
      i += length;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      i += std::max<size_t>(valid, 1);
    }
  }
  return out;
}

}  // namespace pipit::text
