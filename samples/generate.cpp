// Samples text from a GPT: a Hugging Face GPT-2 directory (config.json with "model_type",
// model.safetensors) or one pipit saved (save_model), with the tokenizer found beside it.
//   generate --model DIR --prompt "To be, or not" [--tokens 64] [--sample --top-k 40]
#include <charconv>
#include <exception>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "codec/atomic_file.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "serialize/hf_gpt2.h"
#include "serialize/model_io.h"
#include "support/flags.h"
#include "support/run_flags.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using namespace pipit;

int main(int argc, char** argv) {
  support::Flags flags("generate", "Continues a prompt with a GPT and prints the text.");
  flags.add_required("model", "model directory: Hugging Face GPT-2, or pipit's save_model");
  flags.add("tokenizer", "", "tokenizer directory (default: the model's)");
  flags.add("prompt", "", "text to continue");
  flags.add("ids", "", "or token ids to continue, comma-separated (no tokenizer needed)");
  flags.add("tokens", "64", "new tokens at most");
  flags.add_switch("sample", "sample instead of taking the most likely token");
  flags.add("temperature", "1", "divides the logits before sampling");
  flags.add("top-k", "0", "sample among the k most likely tokens (0: all)");
  flags.add("top-p", "1", "sample among the most likely tokens holding this probability");
  support::add_seed_flag(flags, "0", "sampling");
  flags.add("device", "cpu", "cpu or cuda");
  flags.add("dtype", "f32", "the products' dtype: f32, or bf16 (half the bytes per token)");
  flags.parse(argc, argv);
  if (flags.str("prompt").empty() == flags.str("ids").empty()) {
    flags.fail("give --prompt or --ids (one of them)");
  }
  try {
    const std::string dir = flags.str("model");
    const auto config = nlohmann::json::parse(read_file(dir + "/config.json"));
    GenerationOptions options;
    std::shared_ptr<Sequential> model;
    if (config.contains("model_type")) {
      model = load_hf_gpt2(dir);
      options.stop_token = read_hf_gpt2_config(dir).eos_token_id;
      // transformers' GPT2Config keeps 50256 whatever the vocabulary; like transformers, warn
      // and generate on, here without a stop token.
      const int64_t vocab = dynamic_cast<const TokenPosEmbedding&>(*(*model)[0]).vocab_size();
      if (options.stop_token && (*options.stop_token < 0 || *options.stop_token >= vocab)) {
        std::cerr << "generate: warning: " << dir << "/config.json's eos_token_id "
                  << *options.stop_token << " is outside the vocabulary of " << vocab
                  << "; generating without a stop token\n";
        options.stop_token.reset();
      }
    } else {
      model = std::dynamic_pointer_cast<Sequential>(load_model(dir));
      if (!model) flags.fail("--model " + dir + " does not hold a Sequential GPT");
    }
    model->to(Device::parse(flags.str("device")));
    options.max_new_tokens = flags.integer("tokens");
    options.sample = flags.on("sample");
    options.temperature = flags.number("temperature");
    options.top_k = flags.integer("top-k", 0);
    options.top_p = flags.number("top-p");
    options.seed = support::seed_flag(flags);
    options.dtype = flags.choice("dtype", {"f32", "bf16"}) == "bf16" ? DType::bf16 : DType::f32;

    std::vector<int64_t> prompt;
    std::optional<text::Tokenizer> tokenizer;
    if (!flags.str("prompt").empty()) {
      tokenizer = text::Tokenizer::from_directory(
          flags.str("tokenizer").empty() ? dir : flags.str("tokenizer"));
      for (const uint32_t id : tokenizer->encode(flags.str("prompt"))) prompt.push_back(id);
    } else {
      for (const long long id : flags.integers("ids", 0)) prompt.push_back(id);
    }
    const std::vector<int64_t> out = generate(*model, {prompt}, options).at(0);
    if (tokenizer) {
      const std::vector<uint32_t> ids(out.begin(), out.end());
      // A sample may stop inside a character: printed as U+FFFD, as tokenizers' decode does.
      std::cout << flags.str("prompt") << text::valid_utf8(tokenizer->decode(ids)) << "\n";
    } else {
      for (const int64_t id : out) std::cout << id << " ";
      std::cout << "\n";
    }
  } catch (const std::exception& e) {
    // The library's errors from generate() already begin "generate: ".
    const std::string message = e.what();
    std::cerr << (message.rfind("generate: ", 0) == 0 ? "" : "generate: ") << message << "\n";
    return 1;
  }
}
