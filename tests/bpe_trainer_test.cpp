// text/bpe_trainer.h against Hugging Face tokenizers' BpeTrainer on the same text
// (tests/data/tokenizer/train.txt, tests/make_tokenizer_reference.py): the same merges, a
// compression of the held-out text within 2% of HF's, and files that load back.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "text/bpe_trainer.h"
#include "text/error.h"
#include "text/tokenizer.h"

using namespace pipit::text;
using nlohmann::json;

namespace {

const std::string kTokenizerFiles = std::string(PIPIT_TEST_DATA) + "/tokenizer";

// With `sizes`, the vocabulary's size after each merge, as train's progress reports it.
BpeModel train_small(std::vector<size_t>* sizes = nullptr) {
  BpeTrainer trainer({.vocab_size = 1000});
  trainer.add_file(kTokenizerFiles + "/train.txt");
  if (!sizes) return trainer.train();
  return trainer.train([&](size_t tokens, size_t total) {
    CHECK(total == 1000);
    sizes->push_back(tokens);
  });
}

}  // namespace

TEST_CASE("BPE trainer compresses held-out text within 2% of HF's trainer", "[tokenizer]") {
  const json reference =
      json::parse(read_text_file(kTokenizerFiles + "/reference.json")).at("heldout");
  const std::string heldout = read_text_file(kTokenizerFiles + "/heldout.txt");
  REQUIRE(heldout.size() == reference.at("bytes").get<size_t>());
  const Tokenizer ours(train_small());
  CHECK(ours.vocab_size() == 1000);
  const double ours_bpt = double(heldout.size()) / double(ours.encode(heldout).size());
  const double hf_bpt = reference.at("bytes_per_token");
  INFO("held-out bytes per token: pipit " << ours_bpt << ", HF tokenizers " << hf_bpt);
  CHECK(ours_bpt >= 0.98 * hf_bpt);
  CHECK(ours_bpt <= 1.02 * hf_bpt);
}

TEST_CASE("BPE trainer learns HF's merges in HF's order", "[tokenizer]") {
  const BpeModel ours = train_small();
  const BpeModel hf = load_tokenizer_json(kTokenizerFiles + "/small/tokenizer.json");
  REQUIRE(ours.merges.size() == hf.merges.size());
  for (size_t i = 0; i < ours.merges.size(); ++i) {
    const BpeMerge& a = ours.merges[i];
    const BpeMerge& b = hf.merges[i];
    INFO("merge " << i);
    REQUIRE(ours.tokens[a.left] == hf.tokens[b.left]);
    REQUIRE(ours.tokens[a.right] == hf.tokens[b.right]);
    REQUIRE(a.result == b.result);
  }
  CHECK(ours.tokens == hf.tokens);
}

TEST_CASE("BPE trainer reports each merge's vocabulary size and learns the same merges",
          "[tokenizer]") {
  std::vector<size_t> sizes;
  const BpeModel reported = train_small(&sizes);
  const BpeModel quiet = train_small();
  CHECK(reported.tokens == quiet.tokens);
  REQUIRE(sizes.size() == reported.merges.size());
  for (size_t i = 0; i < sizes.size(); ++i) CHECK(sizes[i] == 1 + 256 + i + 1);
  CHECK(sizes.back() == 1000);
}

TEST_CASE("BPE trainer output saves as vocab.json + merges.txt and loads back", "[tokenizer]") {
  const BpeModel model = train_small();
  const auto dir = std::filesystem::temp_directory_path() / "pipit_bpe_trainer_test";
  std::filesystem::remove_all(dir);
  save_vocab_merges(model, dir.string());
  const Tokenizer loaded = Tokenizer::from_directory(dir.string());
  CHECK(loaded.model().tokens == model.tokens);
  CHECK(loaded.model().merges.size() == model.merges.size());
  CHECK(loaded.model().specials == model.specials);
  const std::string text = "Good morrow, cousin!\n<|endoftext|>What's the news?";
  CHECK(loaded.encode(text) == Tokenizer(model).encode(text));
  // The same files as HF's save_model writes: vocab.json in id order, merges after a
  // version line.
  const std::string merges = read_text_file((dir / "merges.txt").string());
  CHECK(merges.starts_with("#version: 0.2\n"));
  const std::string vocab = read_text_file((dir / "vocab.json").string());
  CHECK(vocab.starts_with("{\"<|endoftext|>\":0,\"!\":1,"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("BPE trainer refuses a vocabulary too small for its alphabet", "[tokenizer]") {
  BpeTrainer trainer({.vocab_size = 200});
  trainer.add_text("some text");
  CHECK_THROWS_WITH(trainer.train(), Catch::Contains("200 tokens has no room"));
}
