// The handshake messages: proofs bind the token to one challenge and one identity.
#include <catch2/catch.hpp>

#include "comm/frame.h"
#include "comm/handshake.h"

using namespace pipit;

TEST_CASE("a proof verifies only for its token, challenge and identity", "[handshake]") {
  const std::string nonce = random_nonce(), other_nonce = random_nonce();
  CHECK(nonce.size() == 64);
  CHECK(nonce != other_nonce);
  const Message proof = proof_message("sesame", nonce, 3);
  CHECK(proof_is_valid(proof.meta, "sesame", nonce, 3));
  CHECK_FALSE(proof_is_valid(proof.meta, "open", nonce, 3));          // another token
  CHECK_FALSE(proof_is_valid(proof.meta, "sesame", other_nonce, 3));  // another challenge
  CHECK_FALSE(proof_is_valid(proof.meta, "sesame", nonce, 4));        // another identity
  CHECK(proof.meta.dump().find("sesame") == std::string::npos);       // never the token itself
  // Without a configured token any proof passes, but a proof field is still required.
  CHECK(proof_is_valid(proof_message("", nonce, 3).meta, "", nonce, 3));
  CHECK_FALSE(proof_is_valid(nlohmann::json::object(), "", nonce, 3));
  CHECK_FALSE(proof_is_valid(proof_message("", nonce, 3).meta, "sesame", nonce, 3));
}

TEST_CASE("Hello messages carry version, id, nonce and session, and bad ones are named",
          "[handshake]") {
  const Message hello = hello_message(-1, "abc", "run-7");
  const Hello parsed = parse_hello(hello.meta);
  CHECK(parsed.id == -1);
  CHECK(parsed.nonce == "abc");
  CHECK(parsed.session == "run-7");
  nlohmann::json old_version = hello.meta;
  old_version["version"] = kProtocolVersion + 1;
  CHECK_THROWS_WITH(parse_hello(old_version), Catch::Contains("protocol version"));
  nlohmann::json no_nonce = hello.meta;
  no_nonce.erase("nonce");
  CHECK_THROWS_WITH(parse_hello(no_nonce), Catch::Contains("nonce"));
  CHECK_THROWS_WITH(parse_hello(nlohmann::json::array()), Catch::Contains("protocol version"));
  CHECK(refusal_reason(refusal_message("busy: later").meta) == "busy: later");
  CHECK_FALSE(refusal_reason(hello.meta).has_value());
}
