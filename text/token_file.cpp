#include "text/token_file.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "text/error.h"

namespace pipit::text {
namespace {

constexpr char kMagic[8] = {'P', 'I', 'P', 'I', 'T', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;
// Ids converted per read() call at most, whatever the caller asks: bounds the buffer.
constexpr size_t kChunkIds = 1 << 16;

uint64_t little_endian(const char* bytes, size_t size) {
  uint64_t value = 0;
  for (size_t i = size; i-- > 0;) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

void put_little_endian(std::string& out, uint64_t value, size_t size) {
  for (size_t i = 0; i < size; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

std::string header_bytes(TokenWidth width, uint64_t count) {
  std::string bytes(kMagic, sizeof(kMagic));
  put_little_endian(bytes, kVersion, 4);
  put_little_endian(bytes, static_cast<uint32_t>(width), 4);
  put_little_endian(bytes, count, 8);
  return bytes;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw TextError(path + ": " + what);
}

}  // namespace

TokenFileHeader parse_token_header(std::span<const char> bytes, uint64_t file_size,
                                   const std::string& source) {
  if (bytes.size() < kTokenHeaderBytes || file_size < kTokenHeaderBytes) {
    fail(source, "not a token file: " + std::to_string(file_size) + " bytes, shorter than the " +
                     std::to_string(kTokenHeaderBytes) + "-byte header");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    fail(source, "not a token file: its first 8 bytes are not \"PIPITTOK\"");
  }
  const uint64_t version = little_endian(bytes.data() + 8, 4);
  if (version != kVersion) {
    fail(source, "token file version " + std::to_string(version) + ", pipit reads version " +
                     std::to_string(kVersion));
  }
  const uint64_t width = little_endian(bytes.data() + 12, 4);
  if (width != 2 && width != 4) {
    fail(source, "id width " + std::to_string(width) + " bytes; expected 2 (uint16) or 4 (uint32)");
  }
  const uint64_t count = little_endian(bytes.data() + 16, 8);
  const uint64_t payload = file_size - kTokenHeaderBytes;
  const bool fits = count <= payload / width;
  if (!fits || payload != count * width) {
    fail(source, "the header declares " + std::to_string(count) + " ids of " +
                     std::to_string(width) + " bytes but " + std::to_string(payload) +
                     " bytes follow it (" + (fits ? "trailing bytes" : "truncated") + ")");
  }
  return {static_cast<TokenWidth>(width), count};
}

TokenWidth token_width_for(size_t vocab_size) {
  return vocab_size <= 65536 ? TokenWidth::u16 : TokenWidth::u32;
}

TokenFileWriter::TokenFileWriter(std::string path, TokenWidth width)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), width_(width) {
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) fail(tmp_, "cannot be created");
  const std::string header = header_bytes(width_, 0);
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
}

TokenFileWriter::~TokenFileWriter() {
  if (!closed_) {
    out_.close();
    std::error_code ignored;
    std::filesystem::remove(tmp_, ignored);
  }
}

void TokenFileWriter::write(std::span<const uint32_t> ids) {
  const size_t width = static_cast<size_t>(width_);
  std::string bytes;
  bytes.reserve(ids.size() * width);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (width_ == TokenWidth::u16 && ids[i] > 0xFFFF) {
      fail(path_, "id " + std::to_string(ids[i]) + " (number " + std::to_string(count_ + i) +
                      ") does not fit a uint16 token file");
    }
    put_little_endian(bytes, ids[i], width);
  }
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out_) fail(tmp_, "write failed");
  count_ += ids.size();
}

void TokenFileWriter::close() {
  const std::string header = header_bytes(width_, count_);
  out_.seekp(0);
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  out_.close();
  if (!out_) fail(tmp_, "could not be written");
  std::error_code error;
  std::filesystem::rename(tmp_, path_, error);
  if (error) fail(path_, "could not be replaced: " + error.message());
  closed_ = true;
}

TokenFileReader::TokenFileReader(std::string path, size_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size), in_(path_, std::ios::binary) {
  if (!in_) fail(path_, "cannot be opened");
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path_, error);
  if (error) fail(path_, "cannot be sized: " + error.message());
  char header[kTokenHeaderBytes] = {};
  in_.read(header, sizeof(header));
  header_ = parse_token_header({header, static_cast<size_t>(in_.gcount())}, size, path_);
}

size_t TokenFileReader::read(std::span<uint32_t> out) {
  const size_t width = static_cast<size_t>(header_.width);
  const size_t n = static_cast<size_t>(
      std::min<uint64_t>({out.size(), header_.count - done_, uint64_t{kChunkIds}}));
  buffer_.resize(n * width);
  in_.read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  if (static_cast<size_t>(in_.gcount()) != buffer_.size()) {
    fail(path_, "ended at id " + std::to_string(done_ + in_.gcount() / width) + " of " +
                    std::to_string(header_.count) + " (the file shrank while being read)");
  }
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint32_t>(little_endian(buffer_.data() + i * width, width));
    if (vocab_size_ && out[i] >= vocab_size_) {
      fail(path_, "id " + std::to_string(out[i]) + " at index " + std::to_string(done_ + i) +
                      " is out of range for a vocabulary of " + std::to_string(vocab_size_) +
                      " tokens");
    }
  }
  done_ += n;
  return n;
}

}  // namespace pipit::text
