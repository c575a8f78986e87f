#pragma once
// Checkpoints of a parameter-server run: one file per shard (written atomically, like every
// pipit checkpoint: a crash leaves the previous one intact), holding the shard's weights,
// its optimizer state and its version. Resuming loads each shard's file into its server;
// workers then read the parameters as usual.
#include <nlohmann/json.hpp>
#include <string>

#include "ps/parameter_server.h"

namespace pipit {

// "<dir>/shard-<s>-of-<k>.ckpt"
std::string shard_checkpoint_path(const std::string& dir, int shard, int servers);

// `model_config`: the whole model's config(), so other tools can rebuild it.
void save_shard_checkpoint(const std::string& path, const ParameterServer& server,
                           const nlohmann::json& model_config, const nlohmann::json& optimizer);
// Loads a file written for the same shard of the same number of shards; errors name the file
// and what does not match.
void load_shard_checkpoint(const std::string& path, ParameterServer& server, int servers);

}  // namespace pipit
