// The token file harness: the bytes as a file, read whole in small pieces; the header parsed
// from memory must agree on whether the file is valid, and an accepted file must come back
// byte for byte from the writer.
#include <cstdio>
#include <optional>

#include "tests/fuzz/harness/check.h"
#include "text/error.h"
#include "text/token_file.h"
#include "text/vocab_files.h"

namespace pipit::fuzz {

bool fuzz_token_file(const uint8_t* data, size_t size) {
  const std::span<const char> bytes(reinterpret_cast<const char*>(data), size);
  const bool header_ok = refuses_only_with<text::TextError>(
      "parse_token_header", [&] { text::parse_token_header(bytes, size, "fuzz input"); });
  const ScratchFile file("tokens", data, size);
  std::optional<text::TokenFileHeader> header;
  std::vector<uint32_t> ids;
  const bool read_ok = refuses_only_with<text::TextError>("TokenFileReader", [&] {
    text::TokenFileReader reader(file.path());
    header = reader.header();
    std::vector<uint32_t> buffer(5);
    while (const size_t n = reader.read(buffer))
      ids.insert(ids.end(), buffer.begin(), buffer.begin() + n);
  });
  require(header_ok == read_ok, "parse_token_header and TokenFileReader disagree");
  if (!read_ok) return false;
  require(ids.size() == header->count, "the reader returned another count than its header's");
  const std::string again = file.path() + ".again";
  std::string written;
  must_not_throw("re-writing a token file", [&] {
    text::TokenFileWriter writer(again, header->width);
    writer.write(ids);
    writer.close();
    written = text::read_text_file(again);
  });
  std::remove(again.c_str());
  require(written == std::string(bytes.data(), bytes.size()),
          "a token file does not survive reading and writing");
  return true;
}

std::vector<std::string> token_file_seeds() {
  std::vector<std::string> seeds;
  const ScratchFile file("token_seed", nullptr, 0);
  for (const auto& [width, ids] : std::vector<std::pair<text::TokenWidth, std::vector<uint32_t>>>{
           {text::TokenWidth::u16, {}},
           {text::TokenWidth::u16, {0, 1, 50256, 65535}},
           {text::TokenWidth::u32, {7, 100000, 4294967295u}}}) {
    text::TokenFileWriter writer(file.path(), width);
    writer.write(ids);
    writer.close();
    seeds.push_back(text::read_text_file(file.path()));
  }
  return seeds;
}

}  // namespace pipit::fuzz
