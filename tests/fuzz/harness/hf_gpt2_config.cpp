// The GPT-2 config harness: JSON text as load_hf_gpt2 reads config.json. hf_gpt2_config may
// only refuse with pipit::Error; a config it accepts must survive being written back
// (to_hf_gpt2_config, as save_hf_gpt2 writes it) and read again, and, when its weights are
// small, build the model it describes.
#include "nn/builders.h"
#include "serialize/hf_gpt2.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {
namespace {

using nlohmann::json;

bool same(const GptConfig& a, const GptConfig& b) {
  return a.vocab_size == b.vocab_size && a.context == b.context && a.layers == b.layers &&
         a.heads == b.heads && a.width == b.width && a.dropout == b.dropout &&
         a.embedding_dropout == b.embedding_dropout && a.layer_norm_eps == b.layer_norm_eps &&
         a.tie_embeddings == b.tie_embeddings && a.head_bias == b.head_bias;
}

// Roughly the weights gpt() would allocate, in f64 so that huge fields do not overflow.
double weights(const GptConfig& c) {
  const double width = double(c.width);
  return (double(c.vocab_size) + double(c.context)) * width + double(c.layers) * 12 * width * width;
}

}  // namespace

bool fuzz_hf_gpt2_config(const uint8_t* data, size_t size) {
  const json config = json::parse(data, data + size, nullptr, false);
  if (config.is_discarded()) return false;
  HfGpt2Config read;
  if (!refuses_only_with("hf_gpt2_config", [&] { read = hf_gpt2_config(config, "config.json"); })) {
    return false;
  }
  must_not_throw("reading back what to_hf_gpt2_config writes", [&] {
    const json written = to_hf_gpt2_config(read.gpt);
    require(same(hf_gpt2_config(written, "written").gpt, read.gpt),
            "a GPT-2 config written back reads as another: " + written.dump());
  });
  if (weights(read.gpt) <= double(1 << 20)) {
    must_not_throw("gpt() of an accepted GPT-2 config", [&] { gpt(read.gpt); });
  }
  return true;
}

std::vector<std::string> hf_gpt2_config_seeds() {
  GptConfig tied;
  tied.vocab_size = 512;
  tied.width = 64;
  tied.layers = 2;
  tied.embedding_dropout = 0.1;
  tied.dropout = 0.1;
  tied.tie_embeddings = true;
  tied.head_bias = false;
  GptConfig untied = tied;
  untied.tie_embeddings = false;
  untied.layer_norm_eps = 1e-6;
  untied.embedding_dropout = 0;
  json sharded = to_hf_gpt2_config(tied);
  sharded["n_inner"] = 256;
  sharded["eos_token_id"] = 511;
  sharded["reorder_and_upcast_attn"] = true;
  return {to_hf_gpt2_config(tied).dump(), to_hf_gpt2_config(untied).dump(), sharded.dump()};
}

}  // namespace pipit::fuzz
