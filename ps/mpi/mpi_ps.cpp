#include "ps/mpi/mpi_ps.h"

#include <chrono>

#include "nn/registry.h"
#include "ps/shard_plan.h"
#include "serialize/module_fingerprint.h"

namespace pipit {

MpiPsRole mpi_ps_role(const PsConfig& config, int rank) {
  if (rank < config.servers) return {true, rank};
  return {false, rank - config.servers};
}

PsRunReport train_ps_over_mpi(const Module& model, const PsConfig& config,
                              const PsRunOptions& options, MpiOptions mpi) {
  validate(config);
  PIPIT_CHECK(options.batch, "train_ps_over_mpi: options.batch is not set");
  PIPIT_CHECK(
      options.slowdown.empty() || static_cast<int>(options.slowdown.size()) == config.workers,
      "train_ps_over_mpi: slowdown has ", options.slowdown.size(), " entries for ", config.workers,
      " workers");
  std::map<int, int> routes;  // endpoint s or servers + w lives on the rank of the same number
  for (int id = 0; id < config.servers + config.workers; ++id) routes[id] = id;
  auto transport =
      MpiTransport::start(routes, mpi, module_fingerprint(model) + "|" + to_json(config).dump());
  PIPIT_CHECK(transport->world_size() == config.servers + config.workers,
              "train_ps_over_mpi: ", config.servers, " shards and ", config.workers,
              " workers need ", config.servers + config.workers, " MPI ranks, the job has ",
              transport->world_size(), " (mpirun -np ", config.servers + config.workers, ")");
  const int rank = transport->rank();
  const MpiPsRole role = mpi_ps_role(config, rank);

  PsRunReport report;
  report.servers.resize(config.servers);
  report.workers.resize(config.workers);
  report.losses.resize(config.workers);
  const auto start = std::chrono::steady_clock::now();
  if (role.server) {
    const NamedParameters all = model.named_parameters();
    NamedParameters own;
    for (const auto& [name, p] :
         shard_parameters(all, plan_shards(all, config.servers), role.index)) {
      own.emplace_back(name, p.detach().clone().requires_grad_());
    }
    ParameterServer server(transport->endpoint(rank), std::move(own), config, role.index);
    start_shard(server, options, model.config());
    if (options.resume) report.first_step = first_step(config, server.stats().version);
    server.serve();
    end_shard(server, options, model.config());
    for (auto& [name, value] : server.weights()) report.weights.emplace(name, value);
    report.optimizer_state = server.optimizer_state();
    report.servers[role.index] = server.stats();
  } else {
    const int w = role.index;
    PsWorker worker(transport->endpoint(rank), build_module(model.config()), config, w,
                    options.slowdown.empty() ? 1.0 : options.slowdown[w]);
    report.losses[w] = run_ps_worker(
        worker, config, options.steps, options.resume,
        [&](int64_t step) { return options.batch(w, step); },
        [&](int64_t step, double loss) {
          if (options.on_step) options.on_step(w, step, loss);
        });
    report.workers[w] = worker.stats();
    report.first_step = options.steps - static_cast<int64_t>(report.losses[w].size());
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  transport->stop();
  return report;
}

}  // namespace pipit
