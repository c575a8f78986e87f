// The handshake harness: JSON metas of Hello frames, one per line, read with read_handshake
// and fed in order to both sides of a handshake (an acceptor and a dialer, with and without
// a token). Bad metas must be ControlErrors and end the handshake with a reason; nothing may
// escape the state machine. Kept small: the handshake's types may still change.
#include "comm/handshake.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {
namespace {

using nlohmann::json;

const std::string kToken = "fuzz-token";

std::string admit(int, const std::string& session) {
  return session == "another-run" ? "this worker serves another run" : "";
}

}  // namespace

bool fuzz_handshake(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // An acceptor and a dialer (expecting peer 1), each with and without a token. Made once and
  // copied: each construction draws a nonce from std::random_device, which is slow.
  static const std::vector<Handshake> fresh = [] {
    std::vector<Handshake> made;
    made.emplace_back(0, "run", kToken, std::nullopt);
    made.emplace_back(0, "run", "", std::nullopt);
    made.emplace_back(-1, "run", kToken, 1);
    made.emplace_back(-1, "run", "", 1);
    return made;
  }();
  std::vector<Handshake> sides = fresh;
  bool any_read = false;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    Message message(MessageKind::Hello, 0);
    message.meta = json::parse(text.substr(at, end - at), nullptr, false);
    at = end + 1;
    if (message.meta.is_discarded()) continue;  // the frame decoder refuses what is not JSON

    HandshakeMessage parsed;
    if (refuses_only_with<ControlError>("read_handshake",
                                        [&] { parsed = read_handshake(message); })) {
      any_read = true;
      std::visit(
          [&](const auto& m) {
            must_not_throw("read_handshake of a written handshake message", [&] {
              require(std::visit([](const auto& b) { return to_message(b).meta; },
                                 read_handshake(to_message(m))) == message.meta,
                      "read_handshake accepted a meta it does not write back the same: " +
                          message.meta.dump());
            });
          },
          parsed);
      if (const auto* proof = std::get_if<Proof>(&parsed)) {
        must_not_throw("proof_is_valid", [&] { proof_is_valid(*proof, kToken, "0123abcd", 1); });
      }
    }
    for (Handshake& side : sides) {
      must_not_throw("Handshake::on_message", [&] {
        const Handshake::Step step = side.on_message(message, admit);
        require(step.state == side.state(), "Handshake::on_message reports another state");
        require(step.state != Handshake::State::Refused || !step.reason.empty(),
                "a refused handshake gives no reason");
      });
    }
  }
  return any_read;
}

std::vector<std::string> handshake_seeds() {
  const auto line = [](const Message& m) { return m.meta.dump() + "\n"; };
  const Hello hello{1, "9f86d081884c7d659a2feaa0c55ad015", "run"};
  return {line(to_message(hello)) + line(to_message(make_proof("", "x", 1))),
          line(to_message(hello)) + line(to_message(make_proof(kToken, "abc", 1))),
          line(to_message(Hello{1, "00ff", "another-run"})) + line(to_message(Proof{""})),
          line(to_message(Refusal{"this worker serves another run"}))};
}

}  // namespace pipit::fuzz
