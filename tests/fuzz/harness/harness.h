#pragma once
// Fuzz harnesses: one function per decoder that feeds it untrusted bytes the way pipit's real
// callers do. The same bodies run under libFuzzer (tests/fuzz/fuzz_main.cpp, one executable
// per harness) and in the Catch2 suite (tests/fuzz_regression_test.cpp replays the corpus
// and the regressions), so every finding stays a test once it is fixed.
//
// The contract a harness enforces: bad input may only end in a pipit::Error (a subclass
// where the caller relies on one, e.g. FrameError from the frame reader's steps). Any other
// exception, a decoded value that does not survive re-encoding, or two decoding paths that
// disagree is a Finding; crashes and undefined behaviour are left to the sanitizers.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pipit::fuzz {

// The decoder misbehaved. Deliberately not a pipit::Error, so no harness swallows it.
class Finding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Runs one input; returns whether the decoder accepted it (false: it refused it with the
// expected error). Throws Finding.
using Harness = bool (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // also the folder under tests/fuzz/corpus and tests/fuzz/regressions
  Harness run;
  size_t max_len;                       // libFuzzer's -max_len for it (run.sh)
  std::vector<std::string> (*seeds)();  // valid inputs made by pipit's own encoders
};

// The name decoders give the input in their errors.
inline const std::string kSource = "fuzz input";

const std::vector<Target>& targets();
const Target* find_target(std::string_view name);

// The harnesses (one file each in this folder) and their seeds.
bool fuzz_frame(const uint8_t* data, size_t size);
bool fuzz_safetensors(const uint8_t* data, size_t size);
bool fuzz_checkpoint(const uint8_t* data, size_t size);
bool fuzz_stage_package(const uint8_t* data, size_t size);
bool fuzz_stage_package_message(const uint8_t* data, size_t size);
bool fuzz_module_config(const uint8_t* data, size_t size);
bool fuzz_training_config(const uint8_t* data, size_t size);
bool fuzz_handshake(const uint8_t* data, size_t size);
bool fuzz_tokenizer_files(const uint8_t* data, size_t size);
bool fuzz_tokenizer_json(const uint8_t* data, size_t size);
bool fuzz_token_file(const uint8_t* data, size_t size);
bool fuzz_hf_gpt2_config(const uint8_t* data, size_t size);

std::vector<std::string> frame_seeds();
std::vector<std::string> safetensors_seeds();
std::vector<std::string> checkpoint_seeds();
std::vector<std::string> stage_package_seeds();
std::vector<std::string> stage_package_message_seeds();
std::vector<std::string> module_config_seeds();
std::vector<std::string> training_config_seeds();
std::vector<std::string> handshake_seeds();
std::vector<std::string> hf_gpt2_config_seeds();
std::vector<std::string> tokenizer_files_seeds();
std::vector<std::string> tokenizer_json_seeds();
std::vector<std::string> token_file_seeds();

}  // namespace pipit::fuzz
