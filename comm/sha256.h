#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), implemented here so that authenticating
// TCP peers needs no crypto library. Not hardened against side channels beyond
// constant_time_equal; used only for handshake MACs over short challenges.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pipit {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);
// Lowercase, 64 characters.
std::string to_hex(const Sha256Digest& digest);
// Compares in time that depends on the lengths only, so a peer probing a MAC learns nothing
// from how long a mismatch takes to be found.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace pipit
