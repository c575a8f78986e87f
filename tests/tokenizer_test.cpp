// text/tokenizer.h against Hugging Face tokenizers: the ids it gave the texts of
// tests/data/tokenizer/reference.json (tests/make_tokenizer_reference.py), from vocab.json +
// merges.txt and from a tokenizer.json; decode(encode(s)) == s on those, on random bytes and
// on invalid UTF-8; long runs of one class in linear time.
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "text/error.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using namespace pipit::text;
using nlohmann::json;

namespace {

const std::string kDir = std::string(PIPIT_TEST_DATA) + "/tokenizer";

const json& tokenizer_reference() {
  static const json data = json::parse(read_text_file(kDir + "/reference.json"));
  return data;
}

const Tokenizer& gpt2_files() {
  static const Tokenizer tokenizer = Tokenizer::from_directory(kDir);
  return tokenizer;
}

const Tokenizer& tokenizer_json() {
  static const Tokenizer tokenizer = Tokenizer::from_directory(kDir + "/small");
  return tokenizer;
}

}  // namespace

TEST_CASE("tokenizer gives Hugging Face's ids from vocab.json + merges.txt", "[tokenizer]") {
  const json& texts = tokenizer_reference().at("texts");
  REQUIRE(texts.size() == 25);
  CHECK(gpt2_files().vocab_size() == 3000);
  for (const json& entry : texts) {
    const std::string text = entry.at("text");
    INFO("text: " << text.substr(0, 80));
    CHECK(gpt2_files().encode(text) == entry.at("ids").get<std::vector<uint32_t>>());
    CHECK(gpt2_files().decode(gpt2_files().encode(text)) == text);
  }
}

TEST_CASE("tokenizer gives Hugging Face's ids from tokenizer.json", "[tokenizer]") {
  CHECK(tokenizer_json().vocab_size() == 1000);
  for (const json& entry : tokenizer_reference().at("texts")) {
    const std::string text = entry.at("text");
    INFO("text: " << text.substr(0, 80));
    CHECK(tokenizer_json().encode(text) == entry.at("small_ids").get<std::vector<uint32_t>>());
  }
}

TEST_CASE("tokenizer gives Hugging Face's ids on 30 KB of held-out text", "[tokenizer]") {
  // Every merge of the small model that the text reaches, rarely used ones included: the
  // ids' FNV-1a hash, as the fixture script computes it.
  const json& heldout = tokenizer_reference().at("heldout");
  const std::vector<uint32_t> ids = tokenizer_json().encode(read_text_file(kDir + "/heldout.txt"));
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const uint32_t id : ids) hash = (hash ^ id) * 0x100000001B3ull;
  CHECK(ids.size() == heldout.at("tokens").get<size_t>());
  CHECK(hash == heldout.at("ids_fnv1a64").get<uint64_t>());
}

TEST_CASE("encoding in pieces with progress gives the ids of encoding whole", "[tokenizer]") {
  const std::string heldout = read_text_file(kDir + "/heldout.txt");
  // Cuts that must not be made: inside "\n\n", beside a multi-byte space; and one beside a
  // special token.
  const std::string tricky = "a\n\nb\n c\nd\n<|endoftext|>\ne\xe3\x80\x80\nf\n\xe3\x80\x80g\nh";
  // The fixtures' vocabularies have no "\n\n"; GPT-2's has, and a cut inside one would change
  // its ids: a model of the 256 bytes and that one merge shows it.
  BpeModel newlines;
  for (int b = 0; b < 256; ++b) newlines.tokens.push_back(std::string(1, static_cast<char>(b)));
  newlines.tokens.push_back("\n\n");
  newlines.tokens.push_back("<|endoftext|>");
  newlines.merges.push_back({'\n', '\n', 256});
  newlines.specials.push_back(257);
  const Tokenizer merged_newlines(newlines);
  REQUIRE(merged_newlines.encode("a\n\nb") == std::vector<uint32_t>{'a', '\n', '\n', 'b'});
  REQUIRE(merged_newlines.encode("a\n\n") == std::vector<uint32_t>{'a', 256});
  for (const Tokenizer* tokenizer : {&merged_newlines, &gpt2_files(), &tokenizer_json()}) {
    for (const std::string& text : {heldout, tricky}) {
      const std::vector<uint32_t> whole = tokenizer->encode(text);
      for (const size_t chunk : {size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 20}) {
        INFO("chunk " << chunk);
        std::vector<uint32_t> pieces;
        std::vector<size_t> done;
        tokenizer->encode(
            text, pieces, [&](size_t bytes) { done.push_back(bytes); }, chunk);
        CHECK(pieces == whole);
        REQUIRE(!done.empty());
        CHECK(done.back() == text.size());
        CHECK(std::is_sorted(done.begin(), done.end()));
        if (chunk == 7 && text == heldout) CHECK(done.size() > 100);  // it did cut
      }
    }
  }
}

TEST_CASE("tokenizer round-trips random bytes and invalid UTF-8", "[tokenizer]") {
  const Tokenizer& tokenizer = gpt2_files();
  // Bytes that are not UTF-8: lone continuations, a truncated sequence, overlongs, a
  // surrogate, past U+10FFFF; each mixed with letters and spaces either side.
  const std::vector<std::string> invalid = {"\x80",
                                            "ab\xC3",
                                            "\xC0\xAF x",
                                            "\xE0\x80\xAF",
                                            "\xED\xA0\x80 word",
                                            "\xF4\x90\x80\x80",
                                            "a\xFF\xFE b",
                                            " \xC3\x28 ",
                                            "don\x92t",
                                            "\xF0\x9F\x98"};
  for (const std::string& text : invalid) {
    INFO("invalid: " << json(text).dump(-1, ' ', true, json::error_handler_t::replace));
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
  }
  // One invalid byte is one token: nothing merges it with what surrounds it.
  CHECK(tokenizer.encode("\xFF").size() == 1);
  std::mt19937 rng(34);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 200, '\0');
    // Half the trials draw from a small alphabet of spaces, letters, quotes and UTF-8 lead
    // bytes, where the pre-tokenizer's cases meet; the rest from all 256 bytes.
    const std::string alphabet = " \n\t'sltaZ09<|\xC3\xA9\xE2\x80\xA8";
    for (char& c : text) {
      c = trial % 2 ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()];
    }
    INFO("trial " << trial);
    REQUIRE(tokenizer.decode(tokenizer.encode(text)) == text);
  }
}

TEST_CASE("tokenizer matches special tokens whole, before pre-tokenizing", "[tokenizer]") {
  const Tokenizer& tokenizer = gpt2_files();
  const uint32_t eot = *tokenizer.token_id("<|endoftext|>");
  const std::vector<uint32_t> ids = tokenizer.encode("a<|endoftext|><|endoftext|>b");
  REQUIRE(ids.size() == 4);
  CHECK(ids[1] == eot);
  CHECK(ids[2] == eot);
  CHECK(tokenizer.encode("<|endoftext|").size() > 1);
}

TEST_CASE("tokenizer decode refuses an id out of range, naming it", "[tokenizer]") {
  const std::vector<uint32_t> ids = {5, 3000};
  CHECK_THROWS_WITH(gpt2_files().decode(ids),
                    Catch::Contains("token id 3000 at position 1 is out of range") &&
                        Catch::Contains("3000 tokens"));
}

TEST_CASE("tokenizer encodes long runs of one class in linear time", "[tokenizer]") {
  // The regex engine's \s+(?!\S) and a naive merge loop are quadratic on these; 4 MB of one
  // class must take about 4x 1 MB's time, not 16x.
  const Tokenizer& tokenizer = gpt2_files();
  for (const char c : {' ', 'x', '7', '!'}) {
    const auto time = [&](size_t bytes) {
      const std::string text = std::string(bytes, c) + "end";
      const auto start = std::chrono::steady_clock::now();
      const std::vector<uint32_t> ids = tokenizer.encode(text);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CHECK(tokenizer.decode(ids) == text);
      return seconds;
    };
    time(1 << 18);  // warm-up
    const double small = time(1 << 20), large = time(1 << 22);
    INFO("class of '" << c << "': 1 MiB " << small << " s, 4 MiB " << large << " s");
    CHECK(large < 10 * small + 0.05);
  }
}

TEST_CASE(
    "text for display: each ill-formed part of UTF-8 is one U+FFFD, as Python's "
    "decode(errors='replace')",
    "[tokenizer]") {
  // Expected values from Python 3.11's bytes.decode("utf-8", errors="replace").
  const std::string r = "\xef\xbf\xbd";
  const std::pair<std::string, std::string> cases[] = {
      {"ab\xe2\x82", "ab" + r},                     // cut short at the end: one U+FFFD
      {"\xe2\x82\xac", "\xe2\x82\xac"},             // the euro sign, valid
      {"\xc0\xaf", r + r},                          // an overlong lead, then a stray byte
      {"\xed\xa0\x80", r + r + r},                  // a surrogate
      {"\xf0\x9f\x98", r},                          // a 4-byte emoji's first 3 bytes
      {"\xf4\x90\x80\x80", r + r + r + r},          // past U+10FFFF
      {"\xe0\x80\xaf", r + r + r},                  // overlong
      {"x\x80y", "x" + r + "y"},                    // a stray continuation byte
      {"\xf0\x9f\x98\x80z", "\xf0\x9f\x98\x80z"}};  // the whole emoji
  for (const auto& [bytes, expected] : cases) {
    INFO(bytes);
    CHECK(pipit::text::valid_utf8(bytes) == expected);
  }
}
