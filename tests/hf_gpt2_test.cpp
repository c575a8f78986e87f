// Hugging Face GPT-2 checkpoints, tied weights and generation with a KV cache, checked against
// what `transformers` computed (tests/data/hf_gpt2, made by tests/make_hf_gpt2_reference.py):
// logits within 1e-5 on f32 CPU, greedy generations token for token.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "bitwise.h"
#include "codec/atomic_file.h"
#include "codec/safetensors.h"
#include "cuda_testing.h"
#include "file_faults.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "serialize/hf_gpt2.h"
#include "serialize/model_io.h"
#include "tensor/factory.h"
#include "tensor/precision.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// PIPIT_TEST_DATA in the environment overrides the build's path: the GPU machine runs the
// suite from another checkout (tools/gpu_check.sh sets it).
const std::string kHfDir =
    std::string(std::getenv("PIPIT_TEST_DATA") ? std::getenv("PIPIT_TEST_DATA") : PIPIT_TEST_DATA) +
    "/hf_gpt2";

const StateDict& hf_reference() {
  static const StateDict data = load_safetensors(kHfDir + "/reference.safetensors");
  return data;
}

std::vector<int64_t> ids(const Tensor& t) {
  return t.contiguous().to_vector<int64_t>();
}

// The model's logits for the reference's tokens [2, 16] (all below 128), each taken modulo
// the model's vocabulary (for the fixture of 96 tokens), as tests/make_hf_gpt2_reference.py does.
Tensor logits_of(Sequential& model) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t vocab = model.config()["layers"][0]["vocab"].get<int64_t>();
  std::vector<int64_t> tokens = ids(hf_reference().at("tokens"));
  for (int64_t& token : tokens) token %= vocab;
  return model.forward(from_vector(tokens, {2, 16}));
}

// Each fixture and its logits in the reference.
const std::vector<std::pair<std::string, std::string>> kHfFixtures = {
    {"tied", "tied_logits"},
    {"sharded", "tied_logits"},
    {"untied", "untied_logits"},
    {"no_embd_dropout", "no_embd_dropout_logits"}};

// The reference's three prompts (prompt_0 to prompt_2), of different lengths.
std::vector<std::vector<int64_t>> reference_prompts() {
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 3; ++i)
    prompts.push_back(ids(hf_reference().at("prompt_" + std::to_string(i))));
  return prompts;
}

// A copy of a fixture checkpoint in a scratch directory, to break on purpose.
void copy_checkpoint(const std::string& name, const fs::path& to) {
  fs::copy(kHfDir + "/" + name, to, fs::copy_options::recursive);
}

// A one-layer, two-head GPT with GPT-2's head (no bias).
GptConfig one_layer(int64_t vocab, int64_t context, int64_t width) {
  GptConfig c;
  c.vocab_size = vocab;
  c.context = context;
  c.layers = 1;
  c.heads = 2;
  c.width = width;
  c.head_bias = false;
  return c;
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("a GPT-2 checkpoint saved by transformers gives transformers' logits", "[hf_gpt2]") {
  for (const auto& [name, logits] : kHfFixtures) {
    INFO(name);
    auto model = load_hf_gpt2(kHfDir + "/" + name);
    CHECK(max_abs_difference(logits_of(*model), hf_reference().at(logits)) <= 1e-5);
    // embd_pdrop 0 builds no Dropout after the embedding: the blocks start at layer 1.
    const bool dropout = name != "no_embd_dropout";
    CHECK(model->config()["layers"][1]["type"] == (dropout ? "Dropout" : "TransformerBlock"));
  }
}

TEST_CASE("a tied head is the token embedding: one tensor, listed and saved once", "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/tied");
  const size_t head = model->size() - 1;
  const auto named = model->named_parameters();
  // wte, wpe, 2 x 12 block tensors, ln_f's 2: the head adds none.
  CHECK(named.size() == 28);
  for (const auto& [name, p] : named) CHECK(name != std::to_string(head) + ".weight");
  auto* linear = dynamic_cast<Linear*>((*model)[head].get());
  REQUIRE(linear != nullptr);
  CHECK(&linear->weight.impl() == &model->state_dict().at("0.tokens.weight").impl());

  // The untied checkpoint keeps its own head.
  auto untied = load_hf_gpt2(kHfDir + "/untied");
  CHECK(untied->named_parameters().size() == 2 + 12 + 2 + 1);
  CHECK(untied->ties().empty());
}

TEST_CASE("a tied weight's gradient sums the embedding's and the head's, and one update moves both",
          "[hf_gpt2]") {
  GptConfig c = one_layer(40, 8, 16);
  c.tie_embeddings = true;
  Generator generator(3);
  auto tied = gpt(c, &generator);
  // The same model untied: its head holds a copy of the embedding.
  c.tie_embeddings = false;
  auto untied = gpt(c);
  StateDict state = tied->state_dict();
  state["3.weight"] = state.at("0.tokens.weight").clone();
  untied->load_state_dict(state);

  const Tensor tokens = from_vector<int64_t>({1, 5, 9, 30, 2, 2, 7, 39}, {2, 4});
  const Tensor targets = from_vector<int64_t>({5, 9, 30, 2, 2, 7, 39, 0}, {2, 4});
  for (auto* m : {tied.get(), untied.get()}) {
    cross_entropy(m->forward(tokens), targets).backward();
  }
  const Tensor summed = untied->state_dict().at("0.tokens.weight").grad() +
                        untied->state_dict().at("3.weight").grad();
  CHECK(max_abs_difference(tied->state_dict().at("0.tokens.weight").grad(), summed) <= 1e-6);
  CHECK(max_abs_difference(summed, untied->state_dict().at("0.tokens.weight").grad()) > 1e-4);

  AdamW optimizer(tied->named_parameters(), AdamWOptions{});
  CHECK(optimizer.parameters().size() == tied->named_parameters().size());
  const Tensor before = tied->state_dict().at("0.tokens.weight").clone();
  optimizer.step();
  auto* head = dynamic_cast<Linear*>((*tied)[3].get());
  CHECK_FALSE(bitwise_equal(head->weight, before));
  CHECK(bitwise_equal(head->weight, tied->state_dict().at("0.tokens.weight")));

  // save_model / load_model keep the tie.
  TempDir dir("tied_model");
  save_model(*tied, (dir / "model").string());
  auto loaded = std::dynamic_pointer_cast<Sequential>(load_model((dir / "model").string()));
  REQUIRE(loaded != nullptr);
  CHECK(loaded->ties() == tied->ties());
  auto* loaded_head = dynamic_cast<Linear*>((*loaded)[3].get());
  CHECK(&loaded_head->weight.impl() == &loaded->state_dict().at("0.tokens.weight").impl());
}

TEST_CASE("a slice or a layer swap that would split a tie is refused by name (pipelines untie)",
          "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/tied");
  const std::string cut = error_of([&] { model->slice(0, 2); });
  CHECK(cut.find("separate '5.weight' from '0.tokens.weight'") != std::string::npos);
  CHECK(model->slice(1, 3)->ties().empty());
  CHECK(model->slice(0, model->size())->ties() == model->ties());
  const std::string swap = error_of([&] { model->replace(5, std::make_shared<Linear>(64, 512)); });
  CHECK(swap.find("tied") != std::string::npos);
}

TEST_CASE("pipit saves a GPT-2 checkpoint as transformers does", "[hf_gpt2]") {
  TempDir dir("hf_save");
  for (const std::string name : {"tied", "untied", "no_embd_dropout"}) {
    INFO(name);
    auto model = load_hf_gpt2(kHfDir + "/" + name);
    const fs::path out = dir / name;
    save_hf_gpt2(*model, out.string());
    // The same tensors under the same names, bit for bit, as the file transformers wrote.
    json metadata;
    const StateDict theirs = load_safetensors(kHfDir + "/" + name + "/model.safetensors");
    const StateDict ours = load_safetensors((out / "model.safetensors").string(), &metadata);
    CHECK(metadata.value("format", "") == "pt");
    REQUIRE(ours.size() == theirs.size());
    for (const auto& [key, tensor] : theirs) {
      INFO(key);
      REQUIRE(ours.count(key));
      CHECK(bitwise_equal(ours.at(key), tensor));
    }
    const json config = json::parse(read_file((out / "config.json").string()));
    const json original = json::parse(read_file(kHfDir + "/" + name + "/config.json"));
    for (const char* field :
         {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "tie_word_embeddings",
          "resid_pdrop", "embd_pdrop", "bos_token_id", "eos_token_id"}) {
      CHECK(config[field] == original.value(field, json(true)));
    }
    auto again = load_hf_gpt2(out.string());
    CHECK(bitwise_equal(logits_of(*again), logits_of(*model)));
  }
  // A head with a bias (gpt()'s default) has no place in GPT2LMHeadModel.
  const std::string refused =
      error_of([&] { save_hf_gpt2(*gpt(GptConfig{}), (dir / "x").string()); });
  CHECK(refused.find("has a bias") != std::string::npos);
}

TEST_CASE("a saved GPT-2 names its end-of-text token inside its vocabulary", "[hf_gpt2]") {
  TempDir dir("hf_eos");
  GptConfig c;
  c.vocab_size = 40;
  c.layers = 1;
  c.width = 16;
  c.heads = 2;
  c.tie_embeddings = true;
  c.head_bias = false;
  const auto model = gpt(c);
  // By default GPT-2's place for <|endoftext|>, the last id (transformers would assume 50256).
  save_hf_gpt2(*model, (dir / "last").string());
  const json last = json::parse(read_file((dir / "last" / "config.json").string()));
  CHECK(last["bos_token_id"] == 39);
  CHECK(last["eos_token_id"] == 39);
  CHECK(read_hf_gpt2_config((dir / "last").string()).eos_token_id == 39);
  save_hf_gpt2(*model, (dir / "given").string(), 7);
  CHECK(read_hf_gpt2_config((dir / "given").string()).eos_token_id == 7);
  const std::string refused = error_of([&] { save_hf_gpt2(*model, (dir / "x").string(), 40); });
  CHECK(refused.find("eos_token_id 40 is outside the vocabulary of 40") != std::string::npos);
  CHECK(!fs::exists(dir / "x"));  // refused before anything was written
  // Loading and saving report the weights' bytes as they go.
  size_t read_bytes = 0, written_bytes = 0;
  const auto loaded =
      load_hf_gpt2((dir / "last").string(), [&](size_t done, size_t) { read_bytes = done; });
  save_hf_gpt2(*loaded, (dir / "again").string(), {},
               [&](size_t done, size_t) { written_bytes = done; });
  CHECK(read_bytes == fs::file_size(dir / "last" / "model.safetensors"));
  CHECK(written_bytes == fs::file_size(dir / "again" / "model.safetensors"));
}

TEST_CASE("greedy generation with the KV cache equals transformers' generate", "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/tied");
  GenerationOptions options;
  options.max_new_tokens = 20;
  options.stop_token = read_hf_gpt2_config(kHfDir + "/tied").eos_token_id;
  REQUIRE(options.stop_token == 511);
  for (int i = 0; i < 3; ++i) {
    INFO("prompt " << i);
    const auto prompt = ids(hf_reference().at("prompt_" + std::to_string(i)));
    const auto out = generate(*model, {prompt}, options);
    CHECK(out.at(0) == ids(hf_reference().at("greedy_" + std::to_string(i))));
  }
  CHECK(model->is_training());  // restored after
}

TEST_CASE("generation with the KV cache equals running the whole sequence each step", "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/untied");
  std::vector<int64_t> sequence = {3, 77, 12, 90, 5};
  GenerationOptions options;
  options.max_new_tokens = 12;
  const auto cached = generate(*model, {sequence}, options).at(0);
  model->eval();
  NoGradGuard no_grad;
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const int64_t T = static_cast<int64_t>(sequence.size());
    const Tensor logits = model->forward(from_vector(sequence, {1, T}));
    const auto last = squeeze(narrow(logits, 1, T - 1, 1), 1).contiguous().to_vector<float>();
    sequence.push_back(std::max_element(last.begin(), last.end()) - last.begin());
  }
  CHECK(cached == std::vector<int64_t>(sequence.begin() + 5, sequence.end()));
}

TEST_CASE("prompts of different lengths in one batch get what each gets alone", "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/tied");
  const std::vector<std::vector<int64_t>> prompts = reference_prompts();
  GenerationOptions options;
  options.max_new_tokens = 15;
  const auto batched = generate(*model, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(batched[i] == generate(*model, {prompts[i]}, options).at(0));
  }
}

TEST_CASE("sampling is seeded, and top-k 1 or a tiny top-p is greedy", "[hf_gpt2]") {
  auto model = load_hf_gpt2(kHfDir + "/untied");
  const std::vector<std::vector<int64_t>> prompt = {{5, 6, 7}};
  GenerationOptions greedy;
  greedy.max_new_tokens = 16;
  GenerationOptions sample = greedy;
  sample.sample = true;
  sample.temperature = 2.0;
  sample.seed = 11;
  const auto a = generate(*model, prompt, sample), b = generate(*model, prompt, sample);
  CHECK(a == b);
  sample.seed = 12;
  CHECK(generate(*model, prompt, sample) != a);
  CHECK(a != generate(*model, prompt, greedy));
  GenerationOptions top_k = sample;
  top_k.top_k = 1;
  CHECK(generate(*model, prompt, top_k) == generate(*model, prompt, greedy));
  GenerationOptions top_p = sample;
  top_p.top_p = 1e-6;
  CHECK(generate(*model, prompt, top_p) == generate(*model, prompt, greedy));
  // Generation stops where the context is full: prompt 3 + 29 new = context 32.
  greedy.max_new_tokens = 100;
  CHECK(generate(*model, prompt, greedy).at(0).size() == 29);
}

TEST_CASE("bad checkpoints and prompts are refused by name, with nothing half-loaded",
          "[hf_gpt2]") {
  TempDir dir("hf_bad");
  auto expect_error = [](const std::function<void()>& run, const std::string& fragment) {
    const std::string message = error_of(run);
    INFO(message);
    CHECK(message.find(fragment) != std::string::npos);
  };
  auto rewrite_config = [&](const fs::path& at, const std::function<void(json&)>& change) {
    json config = json::parse(read_file((at / "config.json").string()));
    change(config);
    write_file_atomic((at / "config.json").string(), config.dump());
  };
  auto rewrite_weights = [&](const fs::path& at, const std::function<void(StateDict&)>& change) {
    StateDict weights = load_safetensors((at / "model.safetensors").string());
    change(weights);
    save_safetensors((at / "model.safetensors").string(), weights, {{"format", "pt"}});
  };
  const fs::path missing = dir / "missing", shape = dir / "shape", arch = dir / "arch",
                 truncated = dir / "truncated", act = dir / "act", extra = dir / "extra";
  for (const auto& at : {missing, shape, arch, truncated, act, extra}) copy_checkpoint("tied", at);
  rewrite_weights(missing, [](StateDict& w) { w.erase("transformer.h.1.mlp.c_fc.bias"); });
  expect_error([&] { load_hf_gpt2(missing.string()); }, "lacks tensor 'h.1.mlp.c_fc.bias'");
  rewrite_weights(shape, [](StateDict& w) {
    w["transformer.h.0.attn.c_attn.weight"] = zeros({192, 64});
  });
  expect_error([&] { load_hf_gpt2(shape.string()); },
               "'h.0.attn.c_attn.weight' has shape [192, 64] but the config needs [64, 192]");
  rewrite_weights(extra, [](StateDict& w) { w["transformer.h.2.ln_1.weight"] = zeros({64}); });
  expect_error([&] { load_hf_gpt2(extra.string()); }, "unexpected tensor 'h.2.ln_1.weight'");
  rewrite_config(arch, [](json& c) { c["model_type"] = "llama"; });
  expect_error([&] { load_hf_gpt2(arch.string()); }, "model_type 'llama' is not GPT-2");
  rewrite_config(act, [](json& c) { c["activation_function"] = "relu"; });
  expect_error([&] { load_hf_gpt2(act.string()); }, "activation_function 'relu'");
  rewrite_config(act, [](json& c) { c["activation_function"] = 3; });
  expect_error([&] { load_hf_gpt2(act.string()); }, "\"activation_function\" must be a string");
  rewrite_config(arch, [](json& c) { c["model_type"] = 2; });
  expect_error([&] { load_hf_gpt2(arch.string()); }, "\"model_type\" must be a string, got 2");
  fs::resize_file(truncated / "model.safetensors",
                  fs::file_size(truncated / "model.safetensors") / 2);
  expect_error([&] { load_hf_gpt2(truncated.string()); }, "model.safetensors");
  expect_error([&] { load_hf_gpt2((dir / "nothing").string()); }, "config.json");

  const fs::path sharded = dir / "sharded";
  copy_checkpoint("sharded", sharded);
  {
    json index = json::parse(read_file((sharded / "model.safetensors.index.json").string()));
    index["weight_map"]["transformer.wte.weight"] = "../elsewhere.safetensors";
    write_file_atomic((sharded / "model.safetensors.index.json").string(), index.dump());
  }
  expect_error([&] { load_hf_gpt2(sharded.string()); }, "is not a file name");

  auto model = load_hf_gpt2(kHfDir + "/tied");
  expect_error([&] { generate(*model, {{1, 2, 512}}); }, "prompt 0 token 2 is id 512");
  expect_error(
      [&] {
        generate(*model, {{1}, std::vector<int64_t>(65, 3)});
      },
      "prompt 1 has 65 tokens, more than the model's context of 64");
}

TEST_CASE("CUDA: generation on the GPU gives the CPU's greedy tokens, and transformers'",
          "[cuda][hf_gpt2]") {
  if (!cuda_ready()) return;
  auto model = load_hf_gpt2(kHfDir + "/tied");
  const std::vector<std::vector<int64_t>> prompts = reference_prompts();
  GenerationOptions options;
  options.max_new_tokens = 20;
  options.stop_token = 511;
  const auto on_cpu = generate(*model, prompts, options);
  // Full f32 products, so near ties in the logits break as on the CPU.
  const std::string precision = float32_matmul_precision();
  set_float32_matmul_precision("highest");
  model->to(kCuda);
  const auto on_gpu = generate(*model, prompts, options);
  CHECK(on_gpu == on_cpu);
  for (size_t i = 0; i < prompts.size(); ++i) {
    CHECK(generate(*model, {prompts[i]}, options).at(0) ==
          ids(hf_reference().at("greedy_" + std::to_string(i))));
  }
  set_float32_matmul_precision(precision);
  // The cached bf16 step (a padded batch, then one token against the cache) as on the CPU.
  auto cpu_model = load_hf_gpt2(kHfDir + "/tied");
  NoGradGuard no_grad;
  model->eval();
  cpu_model->eval();
  const Tensor tokens = from_vector<int64_t>({3, 77, 12, 90, 0, 0, 5, 6}, {2, 4});
  const Tensor next = from_vector<int64_t>({40, 41}, {2, 1});
  std::vector<Tensor> in_f32;
  {
    CachedLayers f32_layers(*model, 2, 8, {0, 2});
    for (const auto& [x, start] : {std::pair{tokens, 0}, std::pair{next, 4}}) {
      in_f32.push_back(f32_layers.forward(x.to(kCuda), start).to(kCpu).to(DType::f64));
    }
  }
  AutocastGuard autocast(DType::bf16);
  CachedLayers gpu_layers(*model, 2, 8, {0, 2}), cpu_layers(*cpu_model, 2, 8, {0, 2});
  for (const auto& [x, start] : {std::pair{tokens, 0}, std::pair{next, 4}}) {
    INFO("positions from " << start);
    const Tensor got = gpu_layers.forward(x.to(kCuda), start).to(kCpu).to(DType::f64);
    const Tensor want = cpu_layers.forward(x, start).to(DType::f64);
    const double scale = max(abs(want)).item<double>();
    measured("cached bf16 logits, GPU vs CPU, of the largest",
             max(abs(sub(got, want))).item<double>() / scale);
    measured("cached logits on the GPU, bf16 vs f32, of the largest",
             max(abs(sub(got, in_f32[start == 0 ? 0 : 1]))).item<double>() / scale);
    // An H200 measured (2026-11-28) 4.7e-3 and 7.2e-3 of the largest logit against the CPU,
    // and 5.2e-3 and 6.4e-3 between its own bf16 and f32 steps: a step that ran in f32 (an
    // autocast that did nothing) would pass the first bound, not the second.
    CHECK(max(abs(sub(got, want))).item<double>() <= 2e-2 * scale);
    CHECK(max(abs(sub(got, in_f32[start == 0 ? 0 : 1]))).item<double>() >= 1e-3 * scale);
  }
}

TEST_CASE("generation in bf16 rounds the weights: a logit lead smaller than bf16's step is lost",
          "[hf_gpt2]") {
  // The final LayerNorm outputs ones whatever the input (weight 0, bias 1), so the logits are
  // the head's row sums: row 1 leads row 0 by 2^-10 in f32, and ties it once rounded to bf16,
  // where greedy takes the lower id.
  const GptConfig c = one_layer(16, 32, 8);
  auto model = gpt(c);
  auto* ln_f = dynamic_cast<LayerNorm*>((*model)[model->size() - 2].get());
  auto* head = dynamic_cast<Linear*>((*model)[model->size() - 1].get());
  REQUIRE(ln_f != nullptr);
  REQUIRE(head != nullptr);
  std::fill_n(ln_f->weight.data<float>(), c.width, 0.0f);
  std::fill_n(ln_f->bias.data<float>(), c.width, 1.0f);
  float* rows = head->weight.data<float>();
  std::fill_n(rows, c.vocab_size * c.width, 0.0f);
  std::fill_n(rows, c.width, 1.0f);
  std::fill_n(rows + c.width, c.width, 1.0f + 1.0f / 1024.0f);
  GenerationOptions options;
  options.max_new_tokens = 6;
  CHECK(generate(*model, {{3, 4, 5}}, options).at(0) == std::vector<int64_t>(6, 1));
  options.dtype = DType::bf16;
  CHECK(generate(*model, {{3, 4, 5}}, options).at(0) == std::vector<int64_t>(6, 0));
  CHECK(generate(*model, {{3, 4, 5}, {7}}, options) ==
        std::vector<std::vector<int64_t>>(2, std::vector<int64_t>(6, 0)));
}
