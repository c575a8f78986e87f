// text/vocab_files.h: vocab.json + merges.txt and tokenizer.json that disagree or are
// malformed are refused, naming the file, line and token at fault.
#include <catch2/catch.hpp>

#include "text/byte_level.h"
#include "text/error.h"
#include "text/tokenizer.h"
#include "text/vocab_files.h"

using namespace pipit::text;

namespace {

// A vocabulary of the 256 bytes (ids in byte order), "<|endoftext|>", and `extra`.
std::string vocab_json(const std::vector<std::string>& extra) {
  std::string json = "{";
  uint32_t id = 0;
  const auto add = [&](const std::string& spelling) {
    json += (id ? ",\"" : "\"") + spelling + "\":" + std::to_string(id);
    ++id;
  };
  for (int b = 0; b < 256; ++b) {
    std::string spelling = bytes_to_spelling(std::string(1, static_cast<char>(b)));
    if (spelling == "\"" || spelling == "\\") spelling = "\\" + spelling;
    add(spelling);
  }
  add("<|endoftext|>");
  for (const std::string& token : extra) add(token);
  return json + "}";
}

// {a,b,...}, built with append: GCC 12 misreports "{" + std::string at -O3 (-Wrestrict).
std::string object(std::initializer_list<std::string> members) {
  std::string out = "{";
  for (const std::string& member : members) out.append(out.size() > 1 ? "," : "").append(member);
  return out.append("}");
}

BpeModel parse(const std::string& vocab, const std::string& merges) {
  return parse_vocab_merges(vocab, merges, kDefaultSpecials);
}

}  // namespace

TEST_CASE("vocab and merges that agree load, with each merge's result", "[tokenizer]") {
  const BpeModel model = parse(vocab_json({"ab", "abc"}), "#version: 0.2\na b\nab c\n");
  REQUIRE(model.merges.size() == 2);
  CHECK(model.tokens[model.merges[1].result] == "abc");
  CHECK(Tokenizer(model).encode("abc") == std::vector<uint32_t>{258});
}

TEST_CASE("vocab and merges that disagree are refused, naming file, line and token",
          "[tokenizer]") {
  CHECK_THROWS_WITH(parse(vocab_json({"ab"}), "#version: 0.2\na b\nab c\n"),
                    Catch::Contains("merges.txt:3") && Catch::Contains("makes 'abc'") &&
                        Catch::Contains("vocab and merges disagree"));
  CHECK_THROWS_WITH(parse(vocab_json({"ab"}), "a b\nzz b\n"),
                    Catch::Contains("merges.txt:2") && Catch::Contains("names 'zz'"));
  CHECK_THROWS_WITH(parse(vocab_json({}), "a b c\n"),
                    Catch::Contains("merges.txt:1") && Catch::Contains("two tokens"));
  CHECK_THROWS_WITH(parse(vocab_json({"x y"}), ""), Catch::Contains("vocab.json") &&
                                                        Catch::Contains("'x y'") &&
                                                        Catch::Contains("byte-level alphabet"));
  CHECK_THROWS_WITH(parse("{\"a\":0,\"b\":0}", ""), Catch::Contains("'a' and 'b' share id 0") ||
                                                        Catch::Contains("'b' and 'a' share id 0"));
  CHECK_THROWS_WITH(parse("{\"a\":0,\"b\":5}", ""), Catch::Contains("'b' has id 5"));
  CHECK_THROWS_WITH(parse("[1, 2]", ""), Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(parse("{\"a\":", ""), Catch::Contains("vocab.json: not valid JSON"));
  CHECK_THROWS_WITH(parse(std::string(100, '[') + std::string(100, ']'), ""),
                    Catch::Contains("nested deeper"));
  CHECK_THROWS_WITH(parse_vocab_merges(vocab_json({}), "", {"<|pad|>"}),
                    Catch::Contains("special token '<|pad|>' is not in it"));
  // Every byte needs a token of its own: drop 'a' (id 97) by giving its id to a word.
  std::string no_a = vocab_json({});
  no_a.replace(no_a.find("\"a\":97"), 6, "\"zz\":97");
  CHECK_THROWS_WITH(Tokenizer(parse(no_a, ""), "vocab.json"),
                    Catch::Contains("vocab.json: byte 97 ('a') has no token"));
}

TEST_CASE("tokenizer.json of another model type or pre-tokenizer is refused", "[tokenizer]") {
  const auto model = [](const std::string& type, const std::string& merge) {
    return "\"model\":{\"type\":\"" + type + "\",\"vocab\":" + vocab_json({"ab"}) +
           ",\"merges\":[" + merge + "]}";
  };
  const auto byte_level = [](const std::string& add_prefix_space) {
    return "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":" + add_prefix_space +
           ",\"use_regex\":true}";
  };
  const std::string bpe = model("BPE", "[\"a\",\"b\"]");
  const std::string added = "\"added_tokens\":[{\"content\":\"<|endoftext|>\",\"special\":true}]";
  const BpeModel ok = parse_tokenizer_json(object({bpe, byte_level("false"), added}));
  CHECK(ok.merges.size() == 1);
  CHECK(ok.specials.size() == 1);
  CHECK_THROWS_WITH(parse_tokenizer_json(object({model("WordPiece", ""), byte_level("false")})),
                    Catch::Contains("pipit reads BPE models only"));
  CHECK_THROWS_WITH(parse_tokenizer_json(object({bpe, byte_level("true")})),
                    Catch::Contains("add_prefix_space false"));
  CHECK_THROWS_AS(parse_tokenizer_json(object({bpe, byte_level("0")})), TextError);
  CHECK_THROWS_WITH(parse_tokenizer_json(object({bpe, byte_level("0")})),
                    Catch::Contains("tokenizer.json: unexpected JSON"));
  CHECK_THROWS_WITH(parse_tokenizer_json(object({byte_level("false")})),
                    Catch::Contains("tokenizer.json: has no \"model\""));
  CHECK_THROWS_WITH(
      parse_tokenizer_json(object({model("BPE", "[\"a\",\"q\"]"), byte_level("false")})),
      Catch::Contains("model.merges[0]") && Catch::Contains("makes 'aq'"));
}
