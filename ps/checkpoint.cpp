#include "ps/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "serialize/checkpoint.h"

namespace pipit {
namespace {

std::string shard_file(const std::string& dir, int shard, int servers, const char* suffix) {
  std::string path = dir;
  path += "/shard-";
  path += std::to_string(shard);
  path += "-of-";
  path += std::to_string(servers);
  path += suffix;
  return path;
}

// The shard's files that exist, newest first.
std::vector<std::string> shard_files(const std::string& dir, int shard, int servers) {
  std::vector<std::string> files;
  for (const std::string& path : {shard_checkpoint_path(dir, shard, servers),
                                  previous_shard_checkpoint_path(dir, shard, servers)}) {
    if (std::filesystem::exists(path)) files.push_back(path);
  }
  return files;
}

}  // namespace

std::string shard_checkpoint_path(const std::string& dir, int shard, int servers) {
  return shard_file(dir, shard, servers, ".ckpt");
}

std::string previous_shard_checkpoint_path(const std::string& dir, int shard, int servers) {
  return shard_file(dir, shard, servers, ".previous.ckpt");
}

void save_shard_checkpoint(const std::string& dir, const ParameterServer& server,
                           const nlohmann::json& model_config, const nlohmann::json& optimizer) {
  Checkpoint checkpoint;
  checkpoint.model_config = model_config;
  checkpoint.weights = server.weights();
  checkpoint.optimizer_config = optimizer;
  checkpoint.optimizer_state = server.optimizer_state();
  checkpoint.step = server.stats().version;
  checkpoint.extra = {{"ps_shard", server.shard()}};
  const int servers = server.config().servers;
  const std::string newest = shard_checkpoint_path(dir, server.shard(), servers);
  // A crash between the two leaves the previous file alone, which resuming then takes.
  if (std::filesystem::exists(newest)) {
    std::filesystem::rename(newest, previous_shard_checkpoint_path(dir, server.shard(), servers));
  }
  save_checkpoint(newest, checkpoint);
}

int64_t common_checkpoint_version(const std::string& dir, int servers) {
  int64_t common = std::numeric_limits<int64_t>::max();
  for (int s = 0; s < servers; ++s) {
    const std::vector<std::string> files = shard_files(dir, s, servers);
    PIPIT_CHECK(!files.empty(), "resuming: shard ", s, " of ", servers, " has no checkpoint (",
                shard_checkpoint_path(dir, s, servers), ")");
    common = std::min(common, load_checkpoint(files.front()).step);
  }
  return common;
}

void load_shard_checkpoint(const std::string& dir, ParameterServer& server, int64_t version) {
  const int servers = server.config().servers;
  const std::vector<std::string> files = shard_files(dir, server.shard(), servers);
  PIPIT_CHECK(!files.empty(), "resuming: shard ", server.shard(), " of ", servers,
              " has no checkpoint (", shard_checkpoint_path(dir, server.shard(), servers), ")");
  std::string versions;
  for (const std::string& path : files) {
    const Checkpoint checkpoint = load_checkpoint(path);
    const nlohmann::json shard = checkpoint.extra.value("ps_shard", nlohmann::json());
    PIPIT_CHECK(shard.is_number_integer() && shard.get<int>() == server.shard(), path,
                ": not a checkpoint of parameter-server shard ", server.shard(), " of ", servers,
                " (its ps_shard is ", shard.dump(), ")");
    if (version < 0 || checkpoint.step == version) {
      server.load(checkpoint.weights, checkpoint.optimizer_state, checkpoint.step);
      return;
    }
    if (!versions.empty()) versions += ", ";
    versions += std::to_string(checkpoint.step);
  }
  throw Error(detail::concat("resuming: shard ", server.shard(), " of ", servers,
                             " has no checkpoint of version ", version,
                             ", the newest every shard has (its files hold ", versions, ")"));
}

}  // namespace pipit
