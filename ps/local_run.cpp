#include "ps/local_run.h"

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/local_communicator.h"
#include "nn/registry.h"
#include "ps/shard_plan.h"

namespace pipit {
namespace {

// Each shard its share of a copy of the model's parameters.
std::vector<std::unique_ptr<ParameterServer>> make_servers(const Module& model,
                                                           const PsConfig& config, LocalHub& hub) {
  const NamedParameters all = model.named_parameters();
  const std::vector<int> shard_of = plan_shards(all, config.servers);
  std::vector<std::unique_ptr<ParameterServer>> servers;
  for (int s = 0; s < config.servers; ++s) {
    NamedParameters own;
    for (const auto& [name, p] : shard_parameters(all, shard_of, s)) {
      own.emplace_back(name, p.detach().clone().requires_grad_());
    }
    servers.push_back(std::make_unique<ParameterServer>(hub.endpoint(config.server_id(s)),
                                                        std::move(own), config, s));
  }
  return servers;
}

std::vector<std::unique_ptr<PsWorker>> make_workers(const Module& model, const PsConfig& config,
                                                    const PsRunOptions& options, LocalHub& hub) {
  std::vector<std::unique_ptr<PsWorker>> workers;
  for (int w = 0; w < config.workers; ++w) {
    workers.push_back(std::make_unique<PsWorker>(
        hub.endpoint(config.worker_id(w)), build_module(model.config()), config, w,
        options.slowdown.empty() ? 1.0 : options.slowdown[w]));
  }
  return workers;
}

// The shards' weights, optimizer state and statistics, and the workers' statistics.
void add_results(const std::vector<std::unique_ptr<ParameterServer>>& servers,
                 const std::vector<std::unique_ptr<PsWorker>>& workers, PsRunReport& report) {
  for (const auto& server : servers) {
    for (auto& [name, value] : server->weights()) report.weights.emplace(name, value);
    for (auto& [name, value] : server->optimizer_state()) {
      // "step" is every shard's; shard 0's is the one reported.
      report.optimizer_state.emplace(name, value);
    }
    report.servers.push_back(server->stats());
  }
  for (const auto& worker : workers) report.workers.push_back(worker->stats());
}

}  // namespace

PsRunReport train_ps_locally(const Module& model, const PsConfig& config,
                             const PsRunOptions& options) {
  validate(config);
  PIPIT_CHECK(options.batch, "train_ps_locally: options.batch is not set");
  PIPIT_CHECK(
      options.slowdown.empty() || static_cast<int>(options.slowdown.size()) == config.workers,
      "train_ps_locally: slowdown has ", options.slowdown.size(), " entries for ", config.workers,
      " workers");
  auto hub = LocalHub::create();
  std::vector<std::unique_ptr<ParameterServer>> servers = make_servers(model, config, *hub);
  std::vector<std::unique_ptr<PsWorker>> workers = make_workers(model, config, options, *hub);

  PsRunReport report;
  report.losses.resize(config.workers);
  std::mutex mutex;
  std::exception_ptr first_error;
  auto fail = [&](std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!first_error) first_error = error;
    // Wake everyone: blocked receives throw ClosedError, which is not the error reported.
    for (int id = 0; id < config.servers + config.workers; ++id) hub->inbox(id)->close();
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < config.servers; ++s) {
    threads.emplace_back([&, s] {
      try {
        start_shard(*servers[s], options, model.config());
        if (s == 0 && options.resume) {
          report.first_step = first_step(config, servers[0]->stats().version);
        }
        servers[s]->serve();
        end_shard(*servers[s], options, model.config());
      } catch (...) {
        fail(std::current_exception());
      }
    });
  }
  for (int w = 0; w < config.workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        report.losses[w] = run_ps_worker(
            *workers[w], config, options.steps, options.resume,
            [&](int64_t step) { return options.batch(w, step); },
            [&](int64_t step, double loss) {
              std::lock_guard<std::mutex> lock(mutex);
              if (options.on_step) options.on_step(w, step, loss);
            });
      } catch (...) {
        fail(std::current_exception());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  add_results(servers, workers, report);
  return report;
}

}  // namespace pipit
