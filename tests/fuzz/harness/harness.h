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

// Every harness as X(name, max_len): the function fuzz_<name> and its seeds <name>_seeds (one
// file each in this folder), and libFuzzer's -max_len for it. max_len: somewhat above the
// largest seed, so mutations can grow an input a little without the fuzzer spending its time
// on megabyte inputs; handshake frames are capped at 4 KiB by the communicator anyway.
#define PIPIT_FUZZ_TARGETS(X)     \
  X(frame, 16384)                 \
  X(safetensors, 16384)           \
  X(checkpoint, 16384)            \
  X(stage_package, 16384)         \
  X(stage_package_message, 16384) \
  X(module_config, 4096)          \
  X(training_config, 4096)        \
  X(handshake, 4096)              \
  X(tokenizer_files, 16384)       \
  X(tokenizer_json, 16384)        \
  X(token_file, 4096)             \
  X(hf_gpt2_config, 4096)

#define PIPIT_DECLARE_FUZZ_TARGET(name, max_len)      \
  bool fuzz_##name(const uint8_t* data, size_t size); \
  std::vector<std::string> name##_seeds();
PIPIT_FUZZ_TARGETS(PIPIT_DECLARE_FUZZ_TARGET)
#undef PIPIT_DECLARE_FUZZ_TARGET

}  // namespace pipit::fuzz
