#include "comm/sha256.h"

namespace pipit {

namespace {

constexpr size_t kBlockSize = 64;

constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

// Streaming state, so HMAC can hash key block and message without concatenating them.
class Sha256 {
 public:
  void update(std::string_view data) {
    length_ += data.size();
    for (char c : data) {
      buffer_[buffered_++] = static_cast<uint8_t>(c);
      if (buffered_ == kBlockSize) {
        compress();
        buffered_ = 0;
      }
    }
  }

  Sha256Digest finish() {
    const uint64_t bit_length = length_ * 8;
    // Padding: a 1 bit, zeros up to 56 mod 64, then the message length in bits, big-endian.
    buffer_[buffered_++] = 0x80;
    if (buffered_ > kBlockSize - 8) {
      while (buffered_ < kBlockSize) buffer_[buffered_++] = 0;
      compress();
      buffered_ = 0;
    }
    while (buffered_ < kBlockSize - 8) buffer_[buffered_++] = 0;
    for (int i = 7; i >= 0; --i) buffer_[buffered_++] = static_cast<uint8_t>(bit_length >> (8 * i));
    compress();
    Sha256Digest digest;
    for (size_t i = 0; i < 8; ++i) {
      for (size_t j = 0; j < 4; ++j)
        digest[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    }
    return digest;
  }

 private:
  void compress() {
    std::array<uint32_t, 64> w;
    for (size_t t = 0; t < 16; ++t) {
      w[t] = uint32_t{buffer_[4 * t]} << 24 | uint32_t{buffer_[4 * t + 1]} << 16 |
             uint32_t{buffer_[4 * t + 2]} << 8 | uint32_t{buffer_[4 * t + 3]};
    }
    for (size_t t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (size_t t = 0; t < 64; ++t) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          kRoundConstants[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, kBlockSize> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;
};

std::string_view as_view(const Sha256Digest& digest) {
  return {reinterpret_cast<const char*>(digest.data()), digest.size()};
}

}  // namespace

Sha256Digest sha256(std::string_view data) {
  Sha256 hash;
  hash.update(data);
  return hash.finish();
}

Sha256Digest hmac_sha256(std::string_view key, std::string_view message) {
  // Keys longer than a block are hashed first; shorter ones are zero-padded (RFC 2104).
  std::array<char, kBlockSize> inner_pad{}, outer_pad{};
  const Sha256Digest hashed_key = key.size() > kBlockSize ? sha256(key) : Sha256Digest{};
  if (key.size() > kBlockSize) key = as_view(hashed_key);
  for (size_t i = 0; i < kBlockSize; ++i) {
    const char k = i < key.size() ? key[i] : '\0';
    inner_pad[i] = static_cast<char>(k ^ 0x36);
    outer_pad[i] = static_cast<char>(k ^ 0x5c);
  }
  Sha256 inner;
  inner.update({inner_pad.data(), kBlockSize});
  inner.update(message);
  const Sha256Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update({outer_pad.data(), kBlockSize});
  outer.update(as_view(inner_digest));
  return outer.finish();
}

std::string to_hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (uint8_t byte : digest) {
    out += kDigits[byte >> 4];
    out += kDigits[byte & 0xf];
  }
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  // volatile keeps the compiler from turning the loop into an early-exit comparison.
  volatile uint8_t difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | static_cast<uint8_t>(a[i] ^ b[i]);
  }
  return difference == 0;
}

}  // namespace pipit
