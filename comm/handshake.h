#pragma once
// The connection handshake (TcpCommunicator drives one Handshake per connection).
//   1. Both sides send Hello{version, id, nonce, session}.
//   2. The dialing side answers the acceptor's Hello with a Proof: HMAC-SHA-256 of the token
//      over "<acceptor's nonce>|<its own id>", so a proof is bound to one challenge and one
//      identity and can be neither replayed nor reflected. Without a token it is empty.
//   3. The acceptor checks the proof, decides whether to admit the peer, and answers with its
//      own proof or with a Refusal. Each side is connected once it has checked the other's.
// Each side announces and proves one id per connection, fixed when the connection opens, so
// an endpoint whose id changes meanwhile (a worker learning its stage) stays consistent.
// Every frame is parsed strictly; anything unexpected ends the handshake with a reason.
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "comm/message.h"

namespace pipit {

struct Hello {
  int id = 0;
  std::string nonce;
  std::string session;
};
struct Proof {
  std::string proof;  // hex HMAC, or empty without a token
};
struct Refusal {
  std::string reason;
};
using HandshakeMessage = std::variant<Hello, Proof, Refusal>;

// 32 random bytes from std::random_device, hex encoded.
std::string random_nonce();
Message to_message(const Hello& hello);
Message to_message(const Proof& proof);
Message to_message(const Refusal& refusal);
// A Hello frame's meta as exactly one of the three; throws ControlError naming what is wrong
// (another kind, another protocol version, a missing, extra, mistyped or oversized field).
HandshakeMessage read_handshake(const Message& message);

Proof make_proof(const std::string& token, const std::string& peer_nonce, int own_id);
// Whether `proof` proves the token for our `nonce` and the id the peer announced (any proof
// passes when no token is configured). Compares in constant time.
bool proof_is_valid(const Proof& proof, const std::string& token, const std::string& nonce,
                    int peer_id);

// Decides on an authenticated incoming peer by the id and session it announced: empty
// admits it, any other text is the refusal's reason.
using AdmitFunction = std::function<std::string(int peer, const std::string& session)>;

class Handshake {
 public:
  enum class State { Waiting, Connected, Refused };
  struct Step {
    std::vector<Message> replies;  // to send, in order (also when refusing)
    State state = State::Waiting;
    std::string reason;  // why, when refused
  };

  // A dialing side knows the peer it expects; an accepting side learns it from the Hello.
  Handshake(int own_id, std::string session, std::string token, std::optional<int> expected_peer);

  Message hello() const;
  Step on_message(const Message& message, const AdmitFunction& admit);

  State state() const { return state_; }
  int peer() const { return peer_; }
  const std::string& peer_session() const { return peer_session_; }

 private:
  Step refuse(std::string reason, std::vector<Message> replies = {});

  int own_id_;
  std::string session_, token_, nonce_;
  std::optional<int> expected_peer_;
  bool hello_received_ = false;
  int peer_ = 0;
  std::string peer_nonce_, peer_session_;
  State state_ = State::Waiting;
};

}  // namespace pipit
