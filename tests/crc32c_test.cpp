// CRC-32C against published check values, in one piece and in pieces of every alignment.
#include <catch2/catch.hpp>
#include <string>

#include "comm/crc32c.h"

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
