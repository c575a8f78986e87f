#include "ps/run.h"

#include <filesystem>

#include "ps/checkpoint.h"

namespace pipit {

void start_shard(ParameterServer& server, const PsRunOptions& options,
                 const nlohmann::json& model_config) {
  const std::string& dir = options.checkpoint_dir;
  if (dir.empty()) return;
  if (options.resume) {
    // Sync shards resume together at the newest version they all saved; async and bounded
    // shards, whose versions drift apart anyway, each at its own newest.
    load_shard_checkpoint(dir, server,
                          server.config().mode == "sync"
                              ? common_checkpoint_version(dir, server.config().servers)
                              : -1);
  } else {
    std::filesystem::create_directories(dir);
  }
  if (options.checkpoint_every <= 0) return;
  server.after_update = [dir, model_config,
                         every = options.checkpoint_every](const ParameterServer& server) {
    if (server.stats().version % every == 0) {
      save_shard_checkpoint(dir, server, model_config, server.config().optimizer);
    }
  };
}

void end_shard(const ParameterServer& server, const PsRunOptions& options,
               const nlohmann::json& model_config) {
  if (options.checkpoint_dir.empty()) return;
  const int64_t every = options.checkpoint_every;
  if (every > 0 && server.stats().version % every == 0) return;  // saved after its update
  save_shard_checkpoint(options.checkpoint_dir, server, model_config, server.config().optimizer);
}

int64_t first_step(const PsConfig& config, int64_t version) {
  return config.mode == "sync" ? version : version * config.accumulate / config.workers;
}

std::vector<double> run_ps_worker(PsWorker& worker, const PsConfig& config, int64_t steps,
                                  bool resume,
                                  const std::function<std::pair<Tensor, Tensor>(int64_t)>& batch,
                                  const std::function<void(int64_t step, double loss)>& on_step) {
  worker.join();
  const int64_t first = resume ? first_step(config, worker.versions().front()) : 0;
  std::vector<double> losses;
  for (int64_t step = first; step < steps; ++step) {
    const auto [input, target] = batch(step);
    losses.push_back(worker.step(input, target));
    if (on_step) on_step(step, losses.back());
  }
  worker.leave();
  return losses;
}

}  // namespace pipit
