// CRC-32C against published check values, in one piece and in pieces of every alignment.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "codec/crc32c.h"

using namespace pipit;

TEST_CASE("CRC-32C matches its check values", "[crc32c]") {
  CHECK(crc32c("") == 0x00000000u);
  CHECK(crc32c("123456789") == 0xe3069283u);              // the standard check value
  CHECK(crc32c(std::string(32, '\0')) == 0x8a9136aau);    // RFC 3720, 32 zero bytes
  CHECK(crc32c(std::string(32, '\xff')) == 0x62a8ab43u);  // RFC 3720, 32 0xff bytes
  std::string ascending(32, '\0');
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<char>(i);
  CHECK(crc32c(ascending) == 0x46dd794eu);  // RFC 3720, 0x00..0x1f
}

TEST_CASE("CRC-32C in pieces equals CRC-32C at once", "[crc32c]") {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = crc32c(bytes);
  for (size_t cut = 0; cut <= 17; ++cut) {
    Crc32c crc;
    crc.update(std::string_view(bytes).substr(0, cut));
    crc.update(std::string_view(bytes).substr(cut, 333));
    crc.update(std::string_view(bytes).substr(cut + 333));
    CHECK(crc.value() == whole);
  }
  bytes[500] ^= 1;
  CHECK(crc32c(bytes) != whole);
}

namespace {

// Bit by bit, straight from the definition (reflected polynomial 0x82f63b78).
uint32_t crc32c_bitwise(std::string_view bytes) {
  uint32_t crc = 0xffffffffu;
  for (const char byte : bytes) {
    crc ^= static_cast<uint8_t>(byte);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82f63b78u : 0);
  }
  return ~crc;
}

}  // namespace

TEST_CASE("CRC-32C of large inputs (folded, or three interleaved stripes) equals the definition",
          "[crc32c]") {
  // Folding takes 256 bytes a step, then 64, then 16; stripes are 4096 bytes, blocks 12288:
  // lengths around each of these, at every alignment of 8, and split in two at odd places.
  std::string bytes(100003, '\0');
  uint64_t state = 12345;
  for (char& byte : bytes) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    byte = static_cast<char>(state >> 56);
  }
  for (const size_t length : {255, 256, 257, 271, 319, 320, 335, 511, 512, 767, 1000, 12287, 12288,
                              12289, 24576, 24583, 40000, 99990}) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const std::string_view piece = std::string_view(bytes).substr(offset, length);
      const uint32_t expected = crc32c_bitwise(piece);
      CHECK(crc32c(piece) == expected);
      Crc32c split;
      const size_t cut = std::min<size_t>(5001, length / 3);
      split.update(piece.substr(0, cut));
      split.update(piece.substr(cut));
      CHECK(split.value() == expected);
    }
  }
}

TEST_CASE("Every CRC-32C implementation this CPU runs equals the definition", "[crc32c]") {
  std::string bytes(40000, '\0');
  uint64_t state = 777;
  for (char& byte : bytes) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    byte = static_cast<char>(state >> 56);
  }
  const std::vector<std::string> names = detail::crc32c_implementations();
  REQUIRE(!names.empty());
  CHECK(names.back() == "table");
  for (const std::string& name : names) {
    INFO(name);
    for (const size_t length : {256, 257, 300, 383, 384, 400, 511, 512, 1000, 4097, 39993}) {
      for (size_t offset = 0; offset < 4; ++offset) {
        const std::string_view piece = std::string_view(bytes).substr(offset, length);
        CHECK(detail::crc32c_with(name, piece) == crc32c_bitwise(piece));
      }
    }
  }
  CHECK_THROWS_WITH(detail::crc32c_with("none", bytes), Catch::Contains("none does not run here"));
}
