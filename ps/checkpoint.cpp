#include "ps/checkpoint.h"

#include "serialize/checkpoint.h"

namespace pipit {

std::string shard_checkpoint_path(const std::string& dir, int shard, int servers) {
  return dir + "/shard-" + std::to_string(shard) + "-of-" + std::to_string(servers) + ".ckpt";
}

void save_shard_checkpoint(const std::string& path, const ParameterServer& server,
                           const nlohmann::json& model_config, const nlohmann::json& optimizer) {
  Checkpoint checkpoint;
  checkpoint.model_config = model_config;
  checkpoint.weights = server.weights();
  checkpoint.optimizer_config = optimizer;
  checkpoint.optimizer_state = server.optimizer_state();
  checkpoint.step = server.stats().version;
  checkpoint.extra = {{"ps_shard", server.shard()}};
  save_checkpoint(path, checkpoint);
}

void load_shard_checkpoint(const std::string& path, ParameterServer& server, int servers) {
  const Checkpoint checkpoint = load_checkpoint(path);
  const nlohmann::json shard = checkpoint.extra.value("ps_shard", nlohmann::json());
  PIPIT_CHECK(shard.is_number_integer() && shard.get<int>() == server.shard(), path,
              ": not a checkpoint of parameter-server shard ", server.shard(), " of ", servers,
              " (its ps_shard is ", shard.dump(), ")");
  server.load(checkpoint.weights, checkpoint.optimizer_state, checkpoint.step);
}

}  // namespace pipit
