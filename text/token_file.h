#pragma once
// Token files: a tokenized corpus, read in bounded pieces so that a file larger than memory
// streams. Layout, little-endian throughout:
//   offset 0   8 bytes  magic "PIPITTOK"
//   offset 8   u32      version, 1
//   offset 12  u32      bytes per id: 2 (uint16) or 4 (uint32)
//   offset 16  u64      count: how many ids follow
//   offset 24  count ids of that width; nothing after them
// The reader refuses, naming the file and the field, a wrong magic, version or width, a file
// whose size is not exactly the header plus count ids (truncated, or with trailing bytes),
// and, given the vocabulary's size, an id past it (naming the id and its index).
#include <cstdint>
#include <fstream>
#include <span>
#include <string>

namespace pipit::text {

enum class TokenWidth : uint32_t { u16 = 2, u32 = 4 };

inline constexpr size_t kTokenHeaderBytes = 24;

struct TokenFileHeader {
  TokenWidth width;
  uint64_t count;
};

// The header of `bytes` (at least kTokenHeaderBytes of them), checked against the file's
// size; `source` names the file in errors.
TokenFileHeader parse_token_header(std::span<const char> bytes, uint64_t file_size,
                                   const std::string& source);

// The narrowest width that holds every id of a vocabulary of `vocab_size` tokens.
TokenWidth token_width_for(size_t vocab_size);

// Writes PATH.tmp and renames it to PATH on close(), so a reader never sees half a file.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, TokenWidth width);
  ~TokenFileWriter();  // without close(): removes PATH.tmp
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Throws TextError naming an id that does not fit the width.
  void write(std::span<const uint32_t> ids);
  void close();
  uint64_t count() const { return count_; }

 private:
  std::string path_, tmp_;
  TokenWidth width_;
  std::ofstream out_;
  uint64_t count_ = 0;
  bool closed_ = false;
};

class TokenFileReader {
 public:
  // vocab_size 0: ids are not checked against a vocabulary.
  explicit TokenFileReader(std::string path, size_t vocab_size = 0);

  const TokenFileHeader& header() const { return header_; }
  // Fills up to out.size() ids; returns how many (0 at the end).
  size_t read(std::span<uint32_t> out);

 private:
  std::string path_;
  size_t vocab_size_;
  std::ifstream in_;
  TokenFileHeader header_{};
  uint64_t done_ = 0;
  std::string buffer_;
};

}  // namespace pipit::text
