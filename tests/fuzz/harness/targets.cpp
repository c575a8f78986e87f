#include <algorithm>

#include "tests/fuzz/harness/harness.h"

namespace pipit::fuzz {

// max_len: somewhat above the largest seed, so mutations can grow an input a little without
// the fuzzer spending its time on megabyte inputs; handshake frames are capped at 4 KiB by
// the communicator anyway.
const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"frame", fuzz_frame, 16384, frame_seeds},
      {"safetensors", fuzz_safetensors, 16384, safetensors_seeds},
      {"checkpoint", fuzz_checkpoint, 16384, checkpoint_seeds},
      {"stage_package", fuzz_stage_package, 16384, stage_package_seeds},
      {"stage_package_message", fuzz_stage_package_message, 16384, stage_package_message_seeds},
      {"module_config", fuzz_module_config, 4096, module_config_seeds},
      {"training_config", fuzz_training_config, 4096, training_config_seeds},
      {"handshake", fuzz_handshake, 4096, handshake_seeds},
      {"tokenizer_files", fuzz_tokenizer_files, 16384, tokenizer_files_seeds},
      {"tokenizer_json", fuzz_tokenizer_json, 16384, tokenizer_json_seeds},
      {"token_file", fuzz_token_file, 4096, token_file_seeds},
      {"hf_gpt2_config", fuzz_hf_gpt2_config, 4096, hf_gpt2_config_seeds},
  };
  return all;
}

const Target* find_target(std::string_view name) {
  const auto& all = targets();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const Target& t) { return t.name == name; });
  return it == all.end() ? nullptr : &*it;
}

}  // namespace pipit::fuzz
