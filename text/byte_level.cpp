#include "text/byte_level.h"

#include <array>

namespace pipit::text {
namespace {

constexpr bool printable(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

constexpr std::array<char32_t, 256> make_map() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int byte = 0; byte < 256; ++byte) map[byte] = printable(byte) ? byte : next++;
  return map;
}

constexpr std::array<char32_t, 256> kMap = make_map();

// The inverse over U+0000..U+0143, the only code points the map uses; -1 elsewhere.
constexpr std::array<int, 0x144> make_inverse() {
  std::array<int, 0x144> inverse{};
  for (int& byte : inverse) byte = -1;
  for (int byte = 0; byte < 256; ++byte) inverse[kMap[byte]] = byte;
  return inverse;
}

constexpr std::array<int, 0x144> kInverse = make_inverse();

}  // namespace

char32_t byte_to_char(unsigned char byte) {
  return kMap[byte];
}

std::string bytes_to_spelling(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) {
    const char32_t cp = kMap[static_cast<unsigned char>(b)];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::optional<std::string> spelling_to_bytes(std::string_view spelling) {
  std::string out;
  out.reserve(spelling.size());
  for (size_t i = 0; i < spelling.size();) {
    const auto lead = static_cast<unsigned char>(spelling[i]);
    char32_t cp = lead;
    // Every character of the map is one or two bytes of UTF-8.
    if (lead >= 0xC2 && lead <= 0xDF && i + 1 < spelling.size() &&
        (static_cast<unsigned char>(spelling[i + 1]) & 0xC0) == 0x80) {
      cp = ((lead & 0x1F) << 6) | (static_cast<unsigned char>(spelling[i + 1]) & 0x3F);
      i += 2;
    } else if (lead < 0x80) {
      i += 1;
    } else {
      return std::nullopt;
    }
    if (cp >= kInverse.size() || kInverse[cp] < 0) return std::nullopt;
    out += static_cast<char>(kInverse[cp]);
  }
  return out;
}

}  // namespace pipit::text
