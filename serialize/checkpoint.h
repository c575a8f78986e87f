#pragma once
// A training checkpoint: one file in the safetensors layout, so other tools can read the
// weights. Tensors are named "model.<name>" (the model's state_dict) and "optim.<name>" (the
// optimizer's); everything else is JSON text in "__metadata__", tagged
// {"format": "pipit-checkpoint", "version": "1"}.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "codec/atomic_file.h"
#include "tensor/state_dict.h"

namespace pipit {

struct Checkpoint {
  nlohmann::json model_config;  // Module::config() of the whole model (build_module rebuilds it)
  StateDict weights;            // the model's state_dict()
  nlohmann::json optimizer_config;
  StateDict optimizer_state;  // the optimizer's state_dict(): "<param>.exp_avg", ..., "step"
  int64_t step = 0;           // optimizer steps taken
  uint64_t rng_seed = 0, rng_offset = 0;            // the data/sampling Generator's state
  nlohmann::json extra = nlohmann::json::object();  // anything else the program wants back
  nlohmann::json grad_scaler = nullptr;  // an f16 run's GradScaler::state_dict(); null otherwise
};

// Written through save_safetensors (temporary file, fsync, rename): a crash at any moment
// leaves the previous checkpoint at `path` intact.
// `on_progress` hears of the bytes written or read (codec/atomic_file.h's ByteProgress).
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     const ByteProgress& on_progress = {});
// Validates the format tag and version and every metadata key; errors name the file and key.
Checkpoint load_checkpoint(const std::string& path, const ByteProgress& on_progress = {});

// The layout checkpoints share with pipeline stage packages: tensor groups under name
// prefixes, and "__metadata__" values that are JSON text, tagged with a format and version.

// Adds `group` to `out` with every name prefixed.
void add_prefixed(StateDict& out, const std::string& prefix, const StateDict& group);
// {"format": format, "version": "<version>"}, to which the writer adds its keys.
nlohmann::json tagged_metadata(const std::string& format, int version);

// Reads a tagged file's decoded tensors and "__metadata__"; every error names the source
// and the key or tensor.
class TaggedReader {
 public:
  // Checks the format tag first: a file without it is "not a <noun>" ("pipit checkpoint").
  TaggedReader(nlohmann::json metadata, std::string source, const std::string& format, int version,
               std::string noun);

  bool has(const std::string& key) const { return metadata_.contains(key); }
  // The raw string stored under `key`.
  const std::string& text(const std::string& key) const;
  // The value under `key` parsed as JSON.
  nlohmann::json parse(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  uint64_t unsigned_integer(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;

  // One group per prefix, names stripped; a tensor under none of them is an error.
  std::vector<StateDict> split(const StateDict& tensors,
                               const std::vector<std::string>& prefixes) const;

 private:
  std::string where() const;

  nlohmann::json metadata_;
  std::string source_;
  std::string noun_;
};

}  // namespace pipit
