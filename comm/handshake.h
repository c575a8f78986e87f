#pragma once
// The messages of the connection handshake, as pure functions (TcpCommunicator drives them).
//   1. Both sides send Hello{version, id, nonce, session}.
//   2. The connecting side answers the acceptor's Hello with a proof: HMAC-SHA-256 of the
//      token over "<acceptor's nonce>|<its own id>", so a proof is bound to one challenge and
//      one identity and can be neither replayed nor reflected. Without a token it is empty.
//   3. The acceptor checks the proof, decides whether to admit the peer, and answers with its
//      own proof or with a refusal. Each side is connected once it has checked the other's.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/message.h"

namespace pipit {

struct Hello {
  int id = 0;
  std::string nonce;
  std::string session;
};

// 32 random bytes from std::random_device, hex encoded.
std::string random_nonce();
Message hello_message(int id, const std::string& nonce, const std::string& session);
// The peer's first Hello; throws an Error saying what is missing or which version it speaks.
Hello parse_hello(const nlohmann::json& meta);
Message proof_message(const std::string& token, const std::string& peer_nonce, int own_id);
// Whether `meta` proves the token for our `nonce` and the id the peer announced (any proof
// passes when no token is configured). Compares in constant time.
bool proof_is_valid(const nlohmann::json& meta, const std::string& token, const std::string& nonce,
                    int peer_id);
Message refusal_message(const std::string& reason);
// The reason, when `meta` is a refusal.
std::optional<std::string> refusal_reason(const nlohmann::json& meta);

}  // namespace pipit
