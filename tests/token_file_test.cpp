// text/token_file.h: ids written and streamed back in both widths, and every kind of bad
// file refused with an error naming the file and what is wrong.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "text/error.h"
#include "text/token_file.h"
#include "text/vocab_files.h"

using namespace pipit::text;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) {
  return (fs::temp_directory_path() / ("pipit_token_file_test_" + name)).string();
}

std::vector<uint32_t> read_all(const std::string& path, size_t vocab_size = 0, size_t chunk = 7) {
  TokenFileReader reader(path, vocab_size);
  std::vector<uint32_t> ids, buffer(chunk);
  while (const size_t n = reader.read(buffer))
    ids.insert(ids.end(), buffer.begin(), buffer.begin() + n);
  return ids;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("token files stream back what was written, in both widths", "[token_file]") {
  for (const TokenWidth width : {TokenWidth::u16, TokenWidth::u32}) {
    const std::string path = scratch("roundtrip");
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 1000; ++i) ids.push_back((i * 7919) % 65536);
    if (width == TokenWidth::u32) ids.push_back(100000);
    {
      TokenFileWriter writer(path, width);
      writer.write(std::span(ids).first(10));
      writer.write(std::span(ids).subspan(10));
      CHECK_FALSE(fs::exists(path));  // only once closed
      writer.close();
    }
    CHECK(fs::file_size(path) == kTokenHeaderBytes + ids.size() * static_cast<size_t>(width));
    CHECK(read_all(path) == ids);
    CHECK(TokenFileReader(path).header().count == ids.size());
    fs::remove(path);
  }
  CHECK(token_width_for(50257) == TokenWidth::u16);
  CHECK(token_width_for(65537) == TokenWidth::u32);
}

TEST_CASE("token files are little-endian with the documented header", "[token_file]") {
  const std::string path = scratch("layout");
  TokenFileWriter writer(path, TokenWidth::u16);
  writer.write(std::vector<uint32_t>{0x0102});
  writer.close();
  const std::string bytes = read_text_file(path);
  CHECK(bytes == std::string("PIPITTOK\1\0\0\0\2\0\0\0\1\0\0\0\0\0\0\0\2\1", 26));
  fs::remove(path);
}

TEST_CASE("token files refuse bad input naming the file and the fault", "[token_file]") {
  const std::string path = scratch("bad");
  const std::string good_header("PIPITTOK\1\0\0\0\2\0\0\0\3\0\0\0\0\0\0\0", 24);
  const auto refused = [&](const std::string& bytes, const std::string& what) {
    write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_all(path), Catch::Contains(path) && Catch::Contains(what));
  };
  refused("PIPIT", "shorter than the 24-byte header");
  refused("NOTTOKEN" + good_header.substr(8) + "abcdef", "not \"PIPITTOK\"");
  std::string version = good_header + "abcdef";
  version[8] = 2;
  refused(version, "token file version 2");
  std::string width = good_header + "abcdef";
  width[12] = 3;
  refused(width, "id width 3 bytes");
  refused(good_header + "abcd", "truncated");
  refused(good_header + "abcdefg", "trailing bytes");
  std::string huge = good_header;
  huge[23] = '\x80';  // 2^63 ids: count * width overflows
  refused(huge + "abcdef", "truncated");

  write_bytes(path, good_header + std::string("\1\0\2\0\x10\x27", 6));  // ids 1, 2, 10000
  CHECK(read_all(path, 10001) == std::vector<uint32_t>{1, 2, 10000});
  CHECK_THROWS_WITH(
      read_all(path, 5000),
      Catch::Contains(path) && Catch::Contains("id 10000 at index 2 is out of range"));
  fs::remove(path);
}

TEST_CASE("token file writer refuses an id its width cannot hold", "[token_file]") {
  const std::string path = scratch("narrow");
  {
    TokenFileWriter writer(path, TokenWidth::u16);
    CHECK_THROWS_WITH(writer.write(std::vector<uint32_t>{1, 70000}),
                      Catch::Contains("id 70000 (number 1) does not fit a uint16"));
  }
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
}
