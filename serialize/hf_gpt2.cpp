#include "serialize/hf_gpt2.h"

#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/shape_ops.h"
#include "codec/atomic_file.h"
#include "codec/json_depth.h"
#include "codec/safetensors.h"

namespace pipit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kHfConfig = "config.json";
constexpr const char* kHfWeights = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// One parameter under both names. Conv1D keeps its weight as [in, out], Linear as [out, in].
struct WeightName {
  std::string pipit, hf;
  bool transposed = false;
};

int64_t first_block(const GptConfig& c) {
  return c.embedding_dropout > 0 ? 2 : 1;
}

std::vector<WeightName> weight_names(const GptConfig& c) {
  std::vector<WeightName> names = {{"0.tokens.weight", "wte.weight"},
                                   {"0.positions.weight", "wpe.weight"}};
  const std::vector<std::pair<std::string, std::string>> norms = {{"ln1", "ln_1"}, {"ln2", "ln_2"}};
  const std::vector<std::pair<std::string, std::string>> linears = {{"attn.qkv", "attn.c_attn"},
                                                                    {"attn.proj", "attn.c_proj"},
                                                                    {"fc", "mlp.c_fc"},
                                                                    {"proj", "mlp.c_proj"}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = std::to_string(first_block(c) + i) + ".",
                      h = "h." + std::to_string(i) + ".";
    for (const auto& [ours, theirs] : norms) {
      names.push_back({p + ours + ".weight", h + theirs + ".weight"});
      names.push_back({p + ours + ".bias", h + theirs + ".bias"});
    }
    for (const auto& [ours, theirs] : linears) {
      names.push_back({p + ours + ".weight", h + theirs + ".weight", true});
      names.push_back({p + ours + ".bias", h + theirs + ".bias"});
    }
  }
  const std::string ln_f = std::to_string(first_block(c) + c.layers);
  names.push_back({ln_f + ".weight", "ln_f.weight"});
  names.push_back({ln_f + ".bias", "ln_f.bias"});
  if (!c.tie_embeddings) {
    names.push_back({std::to_string(first_block(c) + c.layers + 1) + ".weight", "lm_head.weight"});
  }
  return names;
}

json parse_json_file(const std::string& path) {
  const std::string text = read_file(path);
  check_json_nesting(text, path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

int64_t positive_int(const json& config, const char* name, const std::string& source) {
  PIPIT_CHECK(config.contains(name), source, ": GPT-2 config lacks \"", name, "\"");
  const json& value = config[name];
  PIPIT_CHECK(value.is_number_integer() && value.get<int64_t>() > 0, source, ": \"", name,
              "\" must be a positive integer, got ", value.dump());
  return value.get<int64_t>();
}

double number_or(const json& config, const char* name, double fallback, const std::string& source) {
  if (!config.contains(name) || config[name].is_null()) return fallback;
  PIPIT_CHECK(config[name].is_number(), source, ": \"", name, "\" must be a number, got ",
              config[name].dump());
  return config[name].get<double>();
}

std::string string_or(const json& config, const char* name, const std::string& fallback,
                      const std::string& source) {
  if (!config.contains(name) || config[name].is_null()) return fallback;
  PIPIT_CHECK(config[name].is_string(), source, ": \"", name, "\" must be a string, got ",
              config[name].dump());
  return config[name].get<std::string>();
}

bool bool_or(const json& config, const char* name, bool fallback, const std::string& source) {
  if (!config.contains(name) || config[name].is_null()) return fallback;
  PIPIT_CHECK(config[name].is_boolean(), source, ": \"", name, "\" must be true or false, got ",
              config[name].dump());
  return config[name].get<bool>();
}

// Every tensor of the checkpoint by name (the "transformer." prefix that GPT2LMHeadModel puts
// before the body's names removed), with the file it came from.
struct CheckpointTensors {
  std::map<std::string, std::pair<Tensor, std::string>> tensors;

  void add_file(const std::string& path, const ByteProgress& on_progress) {
    for (auto& [name, tensor] : load_safetensors(path, nullptr, on_progress)) {
      const std::string key = name.starts_with("transformer.") ? name.substr(12) : name;
      PIPIT_CHECK(!tensors.count(key), path, ": tensor '", name,
                  "' appears twice in the checkpoint");
      tensors[key] = {tensor, path};
    }
  }
};

CheckpointTensors read_checkpoint(const std::string& dir, const ByteProgress& on_progress) {
  CheckpointTensors out;
  const fs::path root(dir);
  if (fs::exists(root / kHfWeights)) {
    out.add_file((root / kHfWeights).string(), on_progress);
    return out;
  }
  const std::string index_path = (root / kIndex).string();
  PIPIT_CHECK(fs::exists(index_path), dir, " has neither ", kHfWeights, " nor ", kIndex,
              " (pipit reads safetensors checkpoints; pytorch_model.bin is not read)");
  const json index = parse_json_file(index_path);
  PIPIT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              index_path, ": \"weight_map\" must be an object of tensor name -> shard file");
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    PIPIT_CHECK(shard.is_string(), index_path, ": the shard of '", name, "' must be a file name");
    const std::string file = shard.get<std::string>();
    PIPIT_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
                index_path, ": shard '", file, "' of '", name, "' is not a file name in ", dir);
    shards.insert(file);
  }
  for (const std::string& file : shards) out.add_file((root / file).string(), on_progress);
  return out;
}

}  // namespace

HfGpt2Config hf_gpt2_config(const json& config, const std::string& source) {
  PIPIT_CHECK(config.is_object(), source, ": a config must be a JSON object");
  const std::string model_type = string_or(config, "model_type", "gpt2", source);
  PIPIT_CHECK(model_type == "gpt2", source, ": model_type '", model_type,
              "' is not GPT-2 (pipit reads GPT2LMHeadModel checkpoints)");
  if (config.contains("architectures") && config["architectures"].is_array()) {
    for (const json& architecture : config["architectures"]) {
      PIPIT_CHECK(architecture == "GPT2LMHeadModel" || architecture == "GPT2Model", source,
                  ": architecture ", architecture.dump(),
                  " is not GPT2LMHeadModel (its head differs from a language model's)");
    }
  }
  HfGpt2Config out;
  GptConfig& c = out.gpt;
  c.vocab_size = positive_int(config, "vocab_size", source);
  c.context = positive_int(config, "n_positions", source);
  c.width = positive_int(config, "n_embd", source);
  c.layers = positive_int(config, "n_layer", source);
  c.heads = positive_int(config, "n_head", source);
  PIPIT_CHECK(c.width % c.heads == 0, source, ": n_embd ", c.width, " is not a multiple of n_head ",
              c.heads);
  c.layer_norm_eps = number_or(config, "layer_norm_epsilon", 1e-5, source);
  PIPIT_CHECK(c.layer_norm_eps > 0, source, ": layer_norm_epsilon must be positive");
  const std::string activation = string_or(config, "activation_function", "gelu_new", source);
  PIPIT_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", source,
              ": activation_function '", activation,
              "' is not supported (pipit's GELU is the tanh approximation, gelu_new)");
  if (config.contains("n_inner") && !config["n_inner"].is_null()) {
    PIPIT_CHECK(config["n_inner"] == 4 * c.width, source, ": n_inner ", config["n_inner"].dump(),
                " is not supported (pipit's MLP is 4 x n_embd = ", 4 * c.width, ")");
  }
  PIPIT_CHECK(bool_or(config, "scale_attn_weights", true, source), source,
              ": scale_attn_weights false is not supported");
  PIPIT_CHECK(!bool_or(config, "scale_attn_by_inverse_layer_idx", false, source), source,
              ": scale_attn_by_inverse_layer_idx is not supported");
  PIPIT_CHECK(!bool_or(config, "add_cross_attention", false, source), source,
              ": add_cross_attention is not supported");
  const double attention_dropout = number_or(config, "attn_pdrop", 0.1, source);
  c.dropout = number_or(config, "resid_pdrop", 0.1, source);
  PIPIT_CHECK(attention_dropout == c.dropout, source, ": attn_pdrop ", attention_dropout,
              " differs from resid_pdrop ", c.dropout, " (pipit's blocks take one dropout)");
  c.embedding_dropout = number_or(config, "embd_pdrop", 0.1, source);
  for (const double p : {c.dropout, c.embedding_dropout}) {
    PIPIT_CHECK(p >= 0 && p < 1, source, ": a dropout probability must be in [0, 1), got ", p);
  }
  c.tie_embeddings = bool_or(config, "tie_word_embeddings", true, source);
  c.head_bias = false;
  if (config.contains("eos_token_id") && config["eos_token_id"].is_number_integer()) {
    out.eos_token_id = config["eos_token_id"].get<int64_t>();
  }
  return out;
}

HfGpt2Config read_hf_gpt2_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kHfConfig).string();
  return hf_gpt2_config(parse_json_file(path), path);
}

std::shared_ptr<Sequential> load_hf_gpt2(const std::string& dir, const ByteProgress& on_progress) {
  const GptConfig c = read_hf_gpt2_config(dir).gpt;
  CheckpointTensors checkpoint = read_checkpoint(dir, on_progress);
  const std::vector<WeightName> names = weight_names(c);
  std::set<std::string> expected;
  for (const WeightName& name : names) expected.insert(name.hf);
  if (c.tie_embeddings) expected.insert("lm_head.weight");  // older files store the tie twice
  for (const auto& [name, entry] : checkpoint.tensors) {
    // The causal mask buffers that older transformers versions saved are not weights.
    const bool mask_buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
    PIPIT_CHECK(expected.count(name) || mask_buffer, entry.second, ": unexpected tensor '", name,
                "' for a GPT-2 of ", c.layers, " layers");
  }
  // Shapes and presence are checked before the model is built, so a bad file leaves nothing.
  // Every weight is loaded below: none is drawn at random first.
  std::shared_ptr<Sequential> model;
  {
    SkipInitGuard skip;
    model = gpt(c);
  }
  const StateDict ours = model->state_dict();
  StateDict state;
  for (const WeightName& name : names) {
    auto it = checkpoint.tensors.find(name.hf);
    PIPIT_CHECK(it != checkpoint.tensors.end(), dir, ": the checkpoint lacks tensor '", name.hf,
                "'");
    const auto& [tensor, file] = it->second;
    Tensor value = name.transposed && tensor.dim() == 2 ? transpose(tensor, 0, 1) : tensor;
    const Tensor& target = ours.at(name.pipit);
    PIPIT_CHECK(
        value.shape() == target.shape(), file, ": tensor '", name.hf, "' has shape ",
        shape_str(tensor.shape()), " but the config needs ",
        shape_str(name.transposed ? Shape{target.shape()[1], target.shape()[0]} : target.shape()));
    state[name.pipit] = value.to(target.dtype()).contiguous();
  }
  model->load_state_dict(state);
  return model;
}

json to_hf_gpt2_config(const GptConfig& c, std::optional<int64_t> eos_token_id) {
  PIPIT_CHECK(!c.head_bias, "save_hf_gpt2: a head with a bias has no place in GPT2LMHeadModel");
  const int64_t eos = eos_token_id.value_or(c.vocab_size - 1);
  PIPIT_CHECK(eos >= 0 && eos < c.vocab_size, "save_hf_gpt2: eos_token_id ", eos,
              " is outside the vocabulary of ", c.vocab_size);
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"bos_token_id", eos},
          {"eos_token_id", eos},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.context},
          {"n_embd", c.width},
          {"n_layer", c.layers},
          {"n_head", c.heads},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", c.layer_norm_eps},
          {"resid_pdrop", c.dropout},
          {"attn_pdrop", c.dropout},
          {"embd_pdrop", c.embedding_dropout},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", c.tie_embeddings},
          {"torch_dtype", "float32"}};
}

namespace {

// The GptConfig gpt() would build `model` from, or an error naming what GPT-2 has no place for.
GptConfig gpt2_config_of(const Sequential& model) {
  const json config = model.config();
  const json& layers = config["layers"];
  auto type_at = [&](size_t i) {
    return i < layers.size() ? layers[i].value("type", std::string()) : std::string();
  };
  PIPIT_CHECK(model.first_index() == 0 && type_at(0) == "TokenPosEmbedding",
              "save_hf_gpt2: the model must be a whole GPT starting with a TokenPosEmbedding");
  PIPIT_CHECK(!layers[0].contains("rows"), "save_hf_gpt2: the model's vocabulary is padded (",
              layers[0]["vocab"].dump(), " tokens in ", layers[0]["rows"].dump(),
              " rows); GPT-2 checkpoints hold unpadded tensors");
  GptConfig c;
  c.vocab_size = layers[0]["vocab"].get<int64_t>();
  c.context = layers[0]["context"].get<int64_t>();
  c.width = layers[0]["width"].get<int64_t>();
  size_t i = 1;
  if (type_at(i) == "Dropout") c.embedding_dropout = layers[i++]["p"].get<double>();
  c.layers = 0;
  for (; type_at(i) == "TransformerBlock"; ++i, ++c.layers) {
    const json& block = layers[i];
    c.heads = block["heads"].get<int64_t>();
    c.dropout = block["dropout"].get<double>();
    c.layer_norm_eps = block.value("layer_norm_eps", 1e-5);
  }
  PIPIT_CHECK(type_at(i) != "LayerNorm" || layers[i]["eps"].get<double>() == c.layer_norm_eps,
              "save_hf_gpt2: the final LayerNorm's eps differs from the blocks' (GPT-2 has one)");
  PIPIT_CHECK(c.layers > 0 && type_at(i) == "LayerNorm" && type_at(i + 1) == "Linear" &&
                  i + 2 == layers.size(),
              "save_hf_gpt2: the model must be gpt()'s shape (TokenPosEmbedding, [Dropout,] ",
              "TransformerBlocks, LayerNorm, Linear), got layer ", i, " as '", type_at(i), "'");
  PIPIT_CHECK(!layers[i + 1]["bias"].get<bool>(), "save_hf_gpt2: the head (layer ", i + 1,
              ") has a bias, which GPT2LMHeadModel lacks");
  PIPIT_CHECK(layers[i + 1]["out"].get<int64_t>() == c.vocab_size, "save_hf_gpt2: the head (layer ",
              i + 1, ") gives ", layers[i + 1]["out"].dump(), " logits for a vocabulary of ",
              c.vocab_size, " (padded); GPT-2 checkpoints hold unpadded tensors");
  const std::string head_weight = std::to_string(i + 1) + ".weight";
  for (const auto& tie : model.ties()) {
    PIPIT_CHECK(tie == std::make_pair(head_weight, std::string("0.tokens.weight")),
                "save_hf_gpt2: tie of '", tie.first, "' to '", tie.second,
                "' has no GPT-2 counterpart (only the head to the token embedding)");
  }
  c.tie_embeddings = !model.ties().empty();
  c.head_bias = false;
  return c;
}

}  // namespace

void save_hf_gpt2(const Sequential& model, const std::string& dir,
                  std::optional<int64_t> eos_token_id, const ByteProgress& on_progress) {
  const GptConfig c = gpt2_config_of(model);
  const json config = to_hf_gpt2_config(c, eos_token_id);  // checked before anything is written
  // The model must have exactly the parameters of gpt(c), with their shapes.
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p;
  const std::vector<WeightName> names = weight_names(c);
  PIPIT_CHECK(params.size() == names.size(), "save_hf_gpt2: the model has ", params.size(),
              " parameters where GPT-2 of this config has ", names.size());
  StateDict tensors;
  NoGradGuard no_grad;
  for (const WeightName& name : names) {
    auto it = params.find(name.pipit);
    PIPIT_CHECK(it != params.end(), "save_hf_gpt2: the model lacks '", name.pipit, "'");
    Tensor value = it->second.detach().to(Device::cpu()).to(DType::f32);
    if (name.transposed) value = transpose(value, 0, 1);
    const std::string key = name.hf == "lm_head.weight" ? name.hf : "transformer." + name.hf;
    tensors[key] = value.contiguous();
  }
  fs::create_directories(dir);
  save_safetensors((fs::path(dir) / kHfWeights).string(), tensors, {{"format", "pt"}}, on_progress);
  write_file_atomic((fs::path(dir) / kHfConfig).string(), config.dump(2) + "\n");
}

}  // namespace pipit
