#pragma once
// Hugging Face GPT-2 checkpoints (GPT2LMHeadModel, as `save_pretrained` writes it): a
// directory with config.json and model.safetensors, or model.safetensors.index.json and the
// shards it names. Reading maps the config onto GptConfig and the tensors onto gpt()'s names
// (Conv1D weights transposed, lm_head tied to wte unless the config unties them); writing does
// the reverse, so transformers' from_pretrained loads what pipit saves.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "codec/atomic_file.h"
#include "nn/builders.h"
#include "nn/sequential.h"

namespace pipit {

struct HfGpt2Config {
  GptConfig gpt;
  std::optional<int64_t> eos_token_id;  // the end-of-text token, a generation's stop token
};

// The model a GPT-2 config.json describes. Fields that change the computation in ways pipit
// does not implement (another activation, cross-attention, unscaled attention, an MLP width
// other than 4 x n_embd, ...) are refused by name; `source` names the file in errors.
HfGpt2Config hf_gpt2_config(const nlohmann::json& config, const std::string& source);
// The config.json of a GPT-2 of config `c` (which must have no head bias): hf_gpt2_config
// reads it back as `c`. Its bos_token_id and eos_token_id are `eos_token_id`, by default the
// vocabulary's last id, GPT-2's place for <|endoftext|> (without them transformers assumes
// 50256, outside a smaller vocabulary).
nlohmann::json to_hf_gpt2_config(const GptConfig& c, std::optional<int64_t> eos_token_id = {});

// Reads config.json and every weight, checking each tensor's presence and shape before the
// model is built: an error names the file and the tensor, and nothing is half-loaded.
// `on_progress` hears of each weight file's bytes as they are read (codec/atomic_file.h).
std::shared_ptr<Sequential> load_hf_gpt2(const std::string& dir,
                                         const ByteProgress& on_progress = {});
HfGpt2Config read_hf_gpt2_config(const std::string& dir);

// Writes config.json and model.safetensors (f32) into `dir`, made if missing; other files
// there (a tokenizer's) stay. The model must be GPT-2-shaped: gpt() with head_bias false.
// Each file is replaced atomically, the weights first.
// `eos_token_id` as to_hf_gpt2_config's; `on_progress` hears of the weights' bytes written.
void save_hf_gpt2(const Sequential& model, const std::string& dir,
                  std::optional<int64_t> eos_token_id = {}, const ByteProgress& on_progress = {});

}  // namespace pipit
