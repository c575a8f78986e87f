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

// Worker w's run: join, options.steps steps (each loss kept under `mutex`), leave.
void train_worker(PsWorker& worker, int w, const PsRunOptions& options, std::vector<double>& losses,
                  std::mutex& mutex) {
  worker.join();
  for (int64_t step = 0; step < options.steps; ++step) {
    const auto [input, target] = options.batch(w, step);
    const double loss = worker.step(input, target);
    std::lock_guard<std::mutex> lock(mutex);
    losses.push_back(loss);
    if (options.on_step) options.on_step(w, step, loss);
  }
  worker.leave();
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
        if (options.on_server_start) options.on_server_start(*servers[s]);
        servers[s]->serve();
        if (options.on_server_end) options.on_server_end(*servers[s]);
      } catch (...) {
        fail(std::current_exception());
      }
    });
  }
  for (int w = 0; w < config.workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        train_worker(*workers[w], w, options, report.losses[w], mutex);
      } catch (...) {
        fail(std::current_exception());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& server : servers) {
    for (auto& [name, value] : server->weights()) report.weights.emplace(name, value);
    report.servers.push_back(server->stats());
  }
  for (const auto& worker : workers) report.workers.push_back(worker->stats());
  return report;
}

}  // namespace pipit
