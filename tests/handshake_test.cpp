// The handshake: proofs bind the token to one challenge and one identity; frames are parsed
// strictly; the state machine connects, refuses and never throws on what a peer sends.
#include <catch2/catch.hpp>

#include "comm/frame.h"
#include "comm/handshake.h"
#include "pipeline/protocol/messages.h"

using namespace pipit;

namespace {

Message with_meta(nlohmann::json meta) {
  Message message(MessageKind::Hello, 0);
  message.meta = std::move(meta);
  return message;
}

// Runs a dialer and an acceptor against each other, delivering each side's frames to the
// other until neither has anything to say. Returns the acceptor's last step.
struct HandshakePair {
  HandshakePair(Handshake d, Handshake a, AdmitFunction f)
      : dialer(std::move(d)), acceptor(std::move(a)), admit(std::move(f)) {}
  Handshake dialer, acceptor;
  AdmitFunction admit;
  Handshake::Step dialer_step, acceptor_step;

  void run() {
    std::vector<Message> to_acceptor{dialer.hello()}, to_dialer{acceptor.hello()};
    while (!to_acceptor.empty() || !to_dialer.empty()) {
      std::vector<Message> next_to_acceptor, next_to_dialer;
      for (const Message& m : to_dialer) {
        if (dialer.state() != Handshake::State::Waiting) break;
        dialer_step = dialer.on_message(m, nullptr);
        for (Message& r : dialer_step.replies) next_to_acceptor.push_back(std::move(r));
      }
      for (const Message& m : to_acceptor) {
        if (acceptor.state() != Handshake::State::Waiting) break;
        acceptor_step = acceptor.on_message(m, admit);
        for (Message& r : acceptor_step.replies) next_to_dialer.push_back(std::move(r));
      }
      to_acceptor = std::move(next_to_acceptor);
      to_dialer = std::move(next_to_dialer);
    }
  }
};

}  // namespace

TEST_CASE("a proof verifies only for its token, challenge and identity", "[handshake]") {
  const std::string nonce = random_nonce(), other_nonce = random_nonce();
  CHECK(nonce.size() == 64);
  CHECK(nonce != other_nonce);
  const Proof proof = make_proof("sesame", nonce, 3);
  CHECK(proof_is_valid(proof, "sesame", nonce, 3));
  CHECK_FALSE(proof_is_valid(proof, "open", nonce, 3));                      // another token
  CHECK_FALSE(proof_is_valid(proof, "sesame", other_nonce, 3));              // another challenge
  CHECK_FALSE(proof_is_valid(proof, "sesame", nonce, 4));                    // another identity
  CHECK(to_message(proof).meta.dump().find("sesame") == std::string::npos);  // never the token
  // Without a configured token any proof passes; an empty proof never passes with one.
  CHECK(proof_is_valid(make_proof("", nonce, 3), "", nonce, 3));
  CHECK_FALSE(proof_is_valid(make_proof("", nonce, 3), "sesame", nonce, 3));
}

TEST_CASE("handshake frames are parsed strictly, every fault a ControlError naming it",
          "[handshake]") {
  const Message hello = to_message(Hello{-1, "abc", "run-7"});
  const Hello parsed = std::get<Hello>(read_handshake(hello));
  CHECK(parsed.id == -1);
  CHECK(parsed.nonce == "abc");
  CHECK(parsed.session == "run-7");
  CHECK(std::get<Refusal>(read_handshake(to_message(Refusal{"busy: later"}))).reason ==
        "busy: later");
  CHECK(std::get<Proof>(read_handshake(to_message(Proof{"ab12"}))).proof == "ab12");

  auto faulty = [&](const char* field, nlohmann::json value) {
    nlohmann::json meta = hello.meta;
    if (value.is_discarded()) {
      meta.erase(field);
    } else {
      meta[field] = std::move(value);
    }
    return with_meta(std::move(meta));
  };
  const nlohmann::json missing = nlohmann::json(nlohmann::json::value_t::discarded);
  // A session of the wrong type once escaped as a JSON library exception and ended the
  // worker's io thread.
  CHECK_THROWS_MATCHES(read_handshake(faulty("session", 5)), ControlError,
                       Catch::Message("Hello frame field \"session\" is number, not a string"));
  CHECK_THROWS_AS(read_handshake(faulty("session", nlohmann::json::array())), ControlError);
  CHECK_THROWS_WITH(read_handshake(faulty("session", missing)), Catch::Contains("\"session\""));
  CHECK_THROWS_WITH(read_handshake(faulty("nonce", missing)), Catch::Contains("\"nonce\""));
  CHECK_THROWS_WITH(read_handshake(faulty("nonce", std::string(5000, 'a'))),
                    Catch::Contains("more than"));
  CHECK_THROWS_WITH(read_handshake(faulty("id", 1e30)), Catch::Contains("\"id\""));
  CHECK_THROWS_WITH(read_handshake(faulty("id", 4294967296LL)), Catch::Contains("\"id\""));
  CHECK_THROWS_WITH(read_handshake(faulty("id", "3")), Catch::Contains("\"id\""));
  CHECK_THROWS_WITH(read_handshake(faulty("version", kProtocolVersion + 1)),
                    Catch::Contains("protocol version"));
  CHECK_THROWS_WITH(read_handshake(faulty("extra", 1)), Catch::Contains("unknown field \"extra\""));
  CHECK_THROWS_AS(read_handshake(with_meta(nlohmann::json::array())), ControlError);
  CHECK_THROWS_AS(read_handshake(with_meta(nullptr)), ControlError);
  CHECK_THROWS_AS(read_handshake(with_meta({{"proof", 7}})), ControlError);
  CHECK_THROWS_AS(read_handshake(with_meta({{"refused", nullptr}})), ControlError);
  CHECK_THROWS_AS(read_handshake(with_meta({{"proof", "x"}, {"refused", "y"}})), ControlError);
  CHECK_THROWS_AS(read_handshake(Message(PipelineKind::StepBegin, 0)), ControlError);
}

TEST_CASE("the handshake connects both sides with one token and refuses every other case",
          "[handshake]") {
  SECTION("same token: both connected, each knowing the other's id") {
    HandshakePair pair{Handshake(5, "run", "sesame", 7), Handshake(7, "", "sesame", std::nullopt),
                       [](int peer, const std::string& session) {
                         return peer == 5 && session == "run" ? "" : "wrong";
                       }};
    pair.run();
    CHECK(pair.dialer.state() == Handshake::State::Connected);
    CHECK(pair.acceptor.state() == Handshake::State::Connected);
    CHECK(pair.dialer.peer() == 7);
    CHECK(pair.acceptor.peer() == 5);
    CHECK(pair.acceptor.peer_session() == "run");
  }
  SECTION("an acceptor that does not know its id yet proves the id it announced") {
    // The start-up race: a worker learns its stage while a neighbour's handshake is running.
    // The id it announced and the id it proves are the same, so the proof holds.
    HandshakePair pair{
        Handshake(0, "run", "sesame", 1), Handshake(-2, "", "sesame", std::nullopt), {}};
    pair.run();
    CHECK(pair.dialer.state() == Handshake::State::Connected);
    CHECK(pair.acceptor.state() == Handshake::State::Connected);
    CHECK(pair.dialer.peer() == 1);
  }
  SECTION("different tokens: the acceptor refuses the dialer's proof") {
    HandshakePair pair{
        Handshake(5, "run", "open", 7), Handshake(7, "", "sesame", std::nullopt), {}};
    pair.run();
    CHECK(pair.acceptor.state() == Handshake::State::Refused);
    CHECK_THAT(pair.acceptor_step.reason, Catch::Contains("did not prove the shared token"));
    CHECK(pair.dialer.state() != Handshake::State::Connected);
  }
  SECTION("the acceptor's admit refuses: the dialer learns the reason") {
    HandshakePair pair{Handshake(5, "old", "", 7), Handshake(7, "", "", std::nullopt),
                       [](int, const std::string&) { return "not in this run"; }};
    pair.run();
    CHECK(pair.acceptor.state() == Handshake::State::Refused);
    CHECK(pair.dialer.state() == Handshake::State::Refused);
    CHECK(pair.dialer_step.reason == "refused by the peer: not in this run");
  }
  SECTION("a dialed peer announcing another stage id is refused") {
    HandshakePair pair{Handshake(0, "run", "", 1), Handshake(3, "", "", std::nullopt), {}};
    pair.run();
    CHECK(pair.dialer.state() == Handshake::State::Refused);
    CHECK_THAT(pair.dialer_step.reason, Catch::Contains("says it is 3"));
  }
  SECTION("frames out of order or malformed end the handshake with a reason, never a throw") {
    Handshake acceptor(7, "", "sesame", std::nullopt);
    Handshake::Step step = acceptor.on_message(to_message(Proof{"00"}), nullptr);
    CHECK(step.state == Handshake::State::Refused);
    CHECK_THAT(step.reason, Catch::Contains("before the Hello"));
    Handshake other(7, "", "", std::nullopt);
    nlohmann::json bad = to_message(Hello{1, "n", "s"}).meta;
    bad["session"] = {{"nested", true}};
    step = other.on_message(with_meta(bad), nullptr);
    CHECK(step.state == Handshake::State::Refused);
    CHECK_THAT(step.reason, Catch::Contains("\"session\""));
    Handshake twice(7, "", "", std::nullopt);
    twice.on_message(to_message(Hello{1, "n", "s"}), nullptr);
    step = twice.on_message(to_message(Hello{1, "n", "s"}), nullptr);
    CHECK_THAT(step.reason, Catch::Contains("second Hello"));
  }
}
