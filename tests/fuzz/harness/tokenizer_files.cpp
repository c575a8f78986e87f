// The tokenizer file harnesses: vocab.json + merges.txt (one input: the two files joined by
// a NUL byte) and tokenizer.json. An accepted model must survive writing it out and reading
// it back, and a tokenizer built from it must round-trip text, specials and invalid UTF-8
// included.
#include <optional>

#include "tests/fuzz/harness/check.h"
#include "text/bpe_trainer.h"
#include "text/error.h"
#include "text/tokenizer.h"

namespace pipit::fuzz {
namespace {

using text::BpeModel;
using text::TextError;

const std::string kText = "Hello, world! It's 2026.\n\n  <|endoftext|>caf\xC3\xA9 \xFF\xC3 end";

bool same_model(const BpeModel& a, const BpeModel& b) {
  if (a.tokens != b.tokens || a.specials != b.specials || a.merges.size() != b.merges.size()) {
    return false;
  }
  for (size_t i = 0; i < a.merges.size(); ++i) {
    const auto &x = a.merges[i], &y = b.merges[i];
    if (x.left != y.left || x.right != y.right || x.result != y.result) return false;
  }
  return true;
}

// What every accepted model must do: write out and read back the same, and round-trip text.
void check_model(const BpeModel& model) {
  std::optional<BpeModel> back;
  must_not_throw("re-reading a written-out model", [&] {
    std::vector<std::string> specials;
    for (const uint32_t id : model.specials) specials.push_back(model.tokens[id]);
    back = text::parse_vocab_merges(text::format_vocab_json(model), text::format_merges_txt(model),
                                    specials);
  });
  require(same_model(model, *back), "a model does not survive writing out and reading back");
  std::optional<text::Tokenizer> tokenizer;
  // A model may still lack a token for some byte: the tokenizer refuses it then.
  if (!refuses_only_with<TextError>("Tokenizer", [&] { tokenizer.emplace(model, "fuzz"); })) {
    return;
  }
  std::string decoded;
  must_not_throw("encoding and decoding",
                 [&] { decoded = tokenizer->decode(tokenizer->encode(kText)); });
  require(decoded == kText, "decode(encode(text)) != text");
}

std::string joined(const BpeModel& model) {
  return text::format_vocab_json(model) + '\0' + text::format_merges_txt(model);
}

BpeModel trained(size_t vocab_size) {
  text::BpeTrainer trainer({.vocab_size = vocab_size});
  trainer.add_text("the quick brown fox jumps over the lazy dog; the dog's fox isn't quick\n");
  return trainer.train();
}

}  // namespace

bool fuzz_tokenizer_files(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = std::min(input.find('\0'), input.size());
  const std::string_view merges = nul < input.size() ? input.substr(nul + 1) : std::string_view();
  std::optional<BpeModel> model;
  refuses_only_with<TextError>("parse_vocab_merges", [&] {
    model = text::parse_vocab_merges(input.substr(0, nul), merges, text::kDefaultSpecials);
  });
  if (!model) return false;
  check_model(*model);
  return true;
}

bool fuzz_tokenizer_json(const uint8_t* data, size_t size) {
  std::optional<BpeModel> model;
  refuses_only_with<TextError>("parse_tokenizer_json", [&] {
    model = text::parse_tokenizer_json({reinterpret_cast<const char*>(data), size});
  });
  if (!model) return false;
  check_model(*model);
  return true;
}

std::vector<std::string> tokenizer_files_seeds() {
  return {joined(trained(257)), joined(trained(300))};
}

std::vector<std::string> tokenizer_json_seeds() {
  const BpeModel model = trained(290);
  const std::string vocab = text::format_vocab_json(model);
  // merges.txt's lines are tokenizer.json's older "left right" spelling of its merges.
  std::string pairs;
  const std::string lines = text::format_merges_txt(model);
  for (size_t begin = lines.find('\n') + 1; begin < lines.size();) {
    const size_t end = lines.find('\n', begin);
    pairs += (pairs.empty() ? "\"" : ",\"") + lines.substr(begin, end - begin) + "\"";
    begin = end + 1;
  }
  const std::string head =
      "{\"added_tokens\":[{\"id\":0,\"content\":\"<|endoftext|>\",\"special\":true}],"
      "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
      "\"model\":{\"type\":\"BPE\",\"vocab\":" +
      vocab;
  return {head + ",\"merges\":[" + pairs + "]}}",
          head + ",\"ignore_merges\":true,\"merges\":[" + pairs + "]}}"};
}

}  // namespace pipit::fuzz
