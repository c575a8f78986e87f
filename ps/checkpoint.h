#pragma once
// Checkpoints of a parameter-server run: per shard a file holding the shard's weights, its
// optimizer state and its version, written atomically like every pipit checkpoint (a crash
// leaves the previous one intact), and the one before it. Shards save on their own, so when
// a run dies they may have saved different versions; a sync run's shards stay within one
// update of each other, so the newest version every shard has is each shard's newest file or
// the one before, and a resumed sync run starts there on every shard.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "ps/parameter_server.h"

namespace pipit {

// "<dir>/shard-<s>-of-<k>.ckpt", and the one before it, "<dir>/shard-<s>-of-<k>.previous.ckpt".
std::string shard_checkpoint_path(const std::string& dir, int shard, int servers);
std::string previous_shard_checkpoint_path(const std::string& dir, int shard, int servers);

// Moves the shard's newest file to the previous one, then writes the new one. `model_config`:
// the whole model's config(), so other tools can rebuild it.
void save_shard_checkpoint(const std::string& dir, const ParameterServer& server,
                           const nlohmann::json& model_config, const nlohmann::json& optimizer);

// The newest version of which every one of the run's `servers` shards has a checkpoint in
// `dir`; errors name a shard without any.
int64_t common_checkpoint_version(const std::string& dir, int servers);

// Loads the shard's checkpoint of `version` (its newest or the one before; -1: its newest),
// written for the same shard of the same number of shards; errors name the file and what
// does not match.
void load_shard_checkpoint(const std::string& dir, ParameterServer& server, int64_t version = -1);

}  // namespace pipit
