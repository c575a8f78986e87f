#include "comm/handshake.h"

#include <random>

#include "comm/control.h"
#include "comm/frame.h"
#include "comm/json_fields.h"
#include "comm/sha256.h"

namespace pipit {
namespace {

constexpr size_t kMaxNonce = 128;
constexpr size_t kMaxSession = 256;
constexpr size_t kMaxProof = 128;
constexpr size_t kMaxReason = 1024;

std::string proof_text(const std::string& token, const std::string& nonce, int id) {
  return to_hex(hmac_sha256(token, nonce + "|" + std::to_string(id)));
}

}  // namespace

std::string random_nonce() {
  std::random_device device;
  std::string bytes(32, '\0');
  for (char& c : bytes) c = static_cast<char>(device());
  return to_hex(sha256(bytes));
}

Message to_message(const Hello& hello) {
  Message message(MessageKind::Hello, 0);
  message.meta = {{"version", kProtocolVersion},
                  {"id", hello.id},
                  {"nonce", hello.nonce},
                  {"session", hello.session}};
  return message;
}

Message to_message(const Proof& proof) {
  Message message(MessageKind::Hello, 0);
  message.meta = {{"proof", proof.proof}};
  return message;
}

Message to_message(const Refusal& refusal) {
  Message message(MessageKind::Hello, 0);
  message.meta = {{"refused", refusal.reason}};
  return message;
}

HandshakeMessage read_handshake(const Message& message) {
  if (message.kind != MessageKind::Hello) {
    throw ControlError(
        detail::concat("expected a Hello frame, got ", message_kind_name(message.kind)));
  }
  JsonFields<ControlError> f(message.meta, "Hello frame");
  if (f.has("refused")) {
    Refusal refusal{f.string("refused", kMaxReason)};
    f.done();
    return refusal;
  }
  if (f.has("proof")) {
    Proof proof{f.string("proof", kMaxProof)};
    f.done();
    return proof;
  }
  const int64_t version = f.integer("version", 0, 0xffff);
  if (version != kProtocolVersion) {
    f.fail("speaks protocol version ", version, ", this side speaks ", kProtocolVersion);
  }
  Hello hello;
  hello.id = static_cast<int>(
      f.integer("id", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  hello.nonce = f.string("nonce", kMaxNonce);
  hello.session = f.string("session", kMaxSession);
  f.done();
  return hello;
}

Proof make_proof(const std::string& token, const std::string& peer_nonce, int own_id) {
  return {token.empty() ? "" : proof_text(token, peer_nonce, own_id)};
}

bool proof_is_valid(const Proof& proof, const std::string& token, const std::string& nonce,
                    int peer_id) {
  return token.empty() || constant_time_equal(proof.proof, proof_text(token, nonce, peer_id));
}

Handshake::Handshake(int own_id, std::string session, std::string token,
                     std::optional<int> expected_peer)
    : own_id_(own_id),
      session_(std::move(session)),
      token_(std::move(token)),
      nonce_(random_nonce()),
      expected_peer_(expected_peer),
      peer_(expected_peer.value_or(0)) {}

Message Handshake::hello() const {
  return to_message(Hello{own_id_, nonce_, session_});
}

Handshake::Step Handshake::refuse(std::string reason, std::vector<Message> replies) {
  state_ = State::Refused;
  return {std::move(replies), state_, std::move(reason)};
}

Handshake::Step Handshake::on_message(const Message& message, const AdmitFunction& admit) {
  if (state_ != State::Waiting) return refuse("a handshake frame after the handshake ended");
  HandshakeMessage parsed;
  try {
    parsed = read_handshake(message);
  } catch (const ControlError& e) {
    return refuse(e.what());
  }
  if (const auto* refusal = std::get_if<Refusal>(&parsed)) {
    return refuse("refused by the peer: " + refusal->reason);
  }
  if (const auto* hello = std::get_if<Hello>(&parsed)) {
    if (hello_received_) return refuse("a second Hello");
    hello_received_ = true;
    peer_nonce_ = hello->nonce;
    peer_session_ = hello->session;
    if (expected_peer_) {
      // A worker announces a negative id until it knows its stage; any stage id must match.
      if (hello->id >= 0 && hello->id != *expected_peer_) {
        return refuse(detail::concat("dialed endpoint ", *expected_peer_,
                                     " but the peer says it is ", hello->id));
      }
      peer_ = hello->id;
      return {{to_message(make_proof(token_, peer_nonce_, own_id_))}, state_, ""};
    }
    peer_ = hello->id;
    return {{}, state_, ""};
  }
  const Proof& proof = std::get<Proof>(parsed);
  if (!hello_received_) return refuse("a proof before the Hello");
  if (!proof_is_valid(proof, token_, nonce_, peer_)) {
    // The acceptor says so, so that the dialer fails at once instead of retrying.
    const std::string reason =
        "the peer did not prove the shared token (wrong or missing --token-file?)";
    return expected_peer_ ? refuse(reason) : refuse(reason, {to_message(Refusal{reason})});
  }
  if (expected_peer_) {
    peer_ = *expected_peer_;
    state_ = State::Connected;
    return {{}, state_, ""};
  }
  const std::string refusal = admit ? admit(peer_, peer_session_) : "";
  if (!refusal.empty()) return refuse(refusal, {to_message(Refusal{refusal})});
  state_ = State::Connected;
  return {{to_message(make_proof(token_, peer_nonce_, own_id_))}, state_, ""};
}

}  // namespace pipit
