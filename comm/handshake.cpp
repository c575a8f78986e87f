#include "comm/handshake.h"

#include <random>

#include "comm/frame.h"
#include "comm/sha256.h"

namespace pipit {
namespace {

std::string proof(const std::string& token, const std::string& nonce, int id) {
  return to_hex(hmac_sha256(token, nonce + "|" + std::to_string(id)));
}

}  // namespace

std::string random_nonce() {
  std::random_device device;
  std::string bytes(32, '\0');
  for (char& c : bytes) c = static_cast<char>(device());
  return to_hex(sha256(bytes));
}

Message hello_message(int id, const std::string& nonce, const std::string& session) {
  Message hello(MessageKind::Hello, 0);
  hello.meta = {{"version", kProtocolVersion}, {"id", id}, {"nonce", nonce}, {"session", session}};
  return hello;
}

Hello parse_hello(const nlohmann::json& meta) {
  PIPIT_CHECK(meta.is_object() && meta.contains("version") && meta["version"] == kProtocolVersion,
              "protocol version ",
              meta.is_object() && meta.contains("version") ? meta["version"].dump() : "?",
              ", this side speaks ", kProtocolVersion);
  PIPIT_CHECK(meta.contains("id") && meta["id"].is_number_integer() && meta.contains("nonce") &&
                  meta["nonce"].is_string(),
              "Hello without an integer id and a nonce");
  return {meta["id"].get<int>(), meta["nonce"].get<std::string>(),
          meta.value("session", std::string())};
}

Message proof_message(const std::string& token, const std::string& peer_nonce, int own_id) {
  Message answer(MessageKind::Hello, 0);
  answer.meta = {{"proof", token.empty() ? "" : proof(token, peer_nonce, own_id)}};
  return answer;
}

bool proof_is_valid(const nlohmann::json& meta, const std::string& token, const std::string& nonce,
                    int peer_id) {
  if (!meta.is_object() || !meta.contains("proof") || !meta["proof"].is_string()) return false;
  return token.empty() ||
         constant_time_equal(meta["proof"].get<std::string>(), proof(token, nonce, peer_id));
}

Message refusal_message(const std::string& reason) {
  Message refuse(MessageKind::Hello, 0);
  refuse.meta = {{"refused", reason}};
  return refuse;
}

std::optional<std::string> refusal_reason(const nlohmann::json& meta) {
  if (meta.is_object() && meta.contains("refused") && meta["refused"].is_string()) {
    return meta["refused"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace pipit
