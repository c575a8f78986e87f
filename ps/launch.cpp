#include "ps/launch.h"

#include <chrono>
#include <map>
#include <random>

#include "autograd/ops.h"
#include "comm/control.h"
#include "ps/local_run.h"
#include "ps/messages.h"
#include "ps/package.h"
#include "ps/shard_plan.h"
#ifdef PIPIT_WITH_MPI
#include "ps/mpi/mpi_ps.h"
#endif

namespace pipit {
namespace {

// Waits for the message of its kind from each endpoint in `pending` (others are dropped); a
// RoleError, a PeerLost or the timeout is an Error naming the role and its address.
void await_all(TcpCommunicator& comm, const PsConfig& config, std::map<int, MessageKind> pending,
               const std::vector<std::string>& addresses,
               const std::function<void(const Message&)>& on_message = {}) {
  auto name = [&](int id) {
    const bool shard = id < config.servers;
    return (shard ? "shard " + std::to_string(id)
                  : "worker " + std::to_string(id - config.servers)) +
           " (" + addresses.at(static_cast<size_t>(id)) + ")";
  };
  while (!pending.empty()) {
    std::optional<Message> message = comm.try_receive(config.timeout);
    if (!message) {
      const auto& [id, kind] = *pending.begin();
      throw Error(detail::concat("parameter-server launcher: no ", message_kind_name(kind),
                                 " within ", config.timeout.count(), " ms from ", name(id)));
    }
    const int from =
        message->kind == MessageKind::PeerLost ? read_peer_lost(*message).peer : message->from;
    auto it = pending.find(from);
    if (message->kind == MessageKind::RoleError) {
      throw Error("parameter-server launcher: " + name(from) +
                  " failed: " + read_role_error(*message).message);
    }
    if (it == pending.end()) continue;
    if (message->kind == MessageKind::PeerLost) {
      throw Error("parameter-server launcher: lost " + name(from) + ": " +
                  read_peer_lost(*message).reason);
    }
    if (message->kind != it->second) continue;
    if (on_message) on_message(*message);
    pending.erase(it);
  }
}

// How many of the run's roles share role `id`'s host, so each can share out that host's cores.
int roles_on_host(const std::vector<std::string>& addresses, int id) {
  const std::string host = parse_endpoint(addresses[static_cast<size_t>(id)]).first;
  int count = 0;
  for (const std::string& a : addresses) count += parse_endpoint(a).first == host ? 1 : 0;
  return count;
}

// Each shard its parameters; what each will answer when Ready and when done.
void send_shards(TcpCommunicator& comm, const Module& model, const PsConfig& config,
                 const PsPackage& common, const std::vector<std::string>& addresses,
                 std::map<int, MessageKind>& ready, std::map<int, MessageKind>& done) {
  const NamedParameters all = model.named_parameters();
  const std::vector<int> shard_of = plan_shards(all, config.servers);
  for (int s = 0; s < config.servers; ++s) {
    PsPackage package = common;
    package.role = "shard";
    package.index = s;
    package.sharing = roles_on_host(addresses, config.server_id(s));
    for (const auto& [name, p] : shard_parameters(all, shard_of, s)) {
      package.weights.emplace(name, p.detach());
    }
    comm.send(config.server_id(s), to_message(package));
    ready[config.server_id(s)] = MessageKind::Ready;
    done[config.server_id(s)] = MessageKind::State;
  }
}

// Each worker the shards' addresses and its batches of every step, in step order.
void send_workers(TcpCommunicator& comm, const PsConfig& config, const PsRunOptions& options,
                  const PsPackage& common, const std::vector<std::string>& addresses,
                  std::map<int, MessageKind>& done) {
  const std::vector<std::string> shard_addresses(addresses.begin(),
                                                 addresses.begin() + config.servers);
  for (int w = 0; w < config.workers; ++w) {
    PsPackage package = common;
    package.role = "worker";
    package.index = w;
    package.sharing = roles_on_host(addresses, config.worker_id(w));
    package.shards = shard_addresses;
    std::vector<Tensor> xs, ys;
    for (int64_t step = 0; step < options.steps; ++step) {
      const auto [x, y] = options.batch(w, step);
      xs.push_back(x);
      ys.push_back(y);
    }
    package.batch = xs.empty() ? 1 : xs.front().size(0);
    if (!xs.empty()) {
      package.inputs = cat(xs, 0);
      package.targets = cat(ys, 0);
    }
    package.steps = options.steps;
    package.slowdown = options.slowdown.empty() ? 1.0 : options.slowdown[w];
    comm.send(config.worker_id(w), to_message(package));
    done[config.worker_id(w)] = PsKind::Leave;
  }
}

// A shard's final State: its weights and optimizer entries into the report, its version.
void take_final_state(const Message& m, const PsConfig& config, PsRunReport& report) {
  const StateReply reply = read_state_reply(m);
  size_t next = 0;
  for (const std::string& name : reply.weights) report.weights[name] = m.tensors[next++];
  for (const std::string& name : reply.optimizer) {
    // "step" is every shard's; shard 0's is the one reported.
    if (name != "step" || m.from == config.server_id(0)) {
      report.optimizer_state[name] = m.tensors[next];
    }
    ++next;
  }
  report.servers.at(static_cast<size_t>(m.from)).version = m.step;
}

PsRunReport train_ps_on_hosts(const Module& model, const PsConfig& config,
                              const PsRunOptions& options,
                              const std::vector<std::string>& addresses, TcpOptions tcp) {
  const int roles = config.servers + config.workers;
  PIPIT_CHECK(static_cast<int>(addresses.size()) == roles, "train_ps: ", config.servers,
              " shards and ", config.workers, " workers need ", roles,
              " pipit-worker addresses, got ", addresses.size());
  if (tcp.session.empty()) {
    std::random_device device;
    tcp.session = "ps-" + std::to_string(device()) + "-" + std::to_string(device());
  }
  PsPackage common;
  common.config = config;
  common.model = model.config();
  common.checkpoint_dir = options.checkpoint_dir;
  common.checkpoint_every = options.checkpoint_every;
  common.resume = options.resume;
  auto comm = std::make_shared<TcpCommunicator>(kCoordinator, tcp);
  PsRunReport report;
  report.servers.resize(config.servers);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int id = 0; id < roles; ++id) {
      const auto [host, port] = parse_endpoint(addresses[static_cast<size_t>(id)]);
      comm->connect(id, host, port);
    }
    std::map<int, MessageKind> shards_ready, done;
    send_shards(*comm, model, config, common, addresses, shards_ready, done);
    await_all(*comm, config, shards_ready, addresses, [&](const Message& m) {
      if (m.from == config.server_id(0) && options.resume) {
        report.first_step = first_step(config, m.step);
      }
    });
    send_workers(*comm, config, options, common, addresses, done);
    // A worker says Ready, trains, and says PsLeave; a fast one may be done before a slow one
    // is Ready, so the launcher waits only for the ends: every worker's PsLeave, every
    // shard's State.
    await_all(*comm, config, done, addresses, [&](const Message& m) {
      if (m.kind == MessageKind::State) take_final_state(m, config, report);
    });
  } catch (...) {
    for (int id = 0; id < roles; ++id) comm->send(id, Message(MessageKind::Shutdown, 0));
    comm->close();
    throw;
  }
  comm->close();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace

PsRunReport train_ps(const Module& model, const PsConfig& config, const PsRunOptions& options,
                     PsLaunch launch) {
  validate(config);
  PIPIT_CHECK(options.batch, "train_ps: options.batch is not set");
  PIPIT_CHECK(
      options.slowdown.empty() || static_cast<int>(options.slowdown.size()) == config.workers,
      "train_ps: slowdown has ", options.slowdown.size(), " entries for ", config.workers,
      " workers");
  switch (launch.kind) {
    case PsLaunch::Kind::threads:
      return train_ps_locally(model, config, options);
    case PsLaunch::Kind::hosts:
      return train_ps_on_hosts(model, config, options, launch.addresses, launch.tcp_options);
    case PsLaunch::Kind::mpi:
#ifdef PIPIT_WITH_MPI
      return train_ps_over_mpi(model, config, options, launch.mpi_options);
#else
      throw Error("train_ps: PsLaunch::mpi needs pipit built with MPI (Open MPI was not found)");
#endif
  }
  throw Error("train_ps: unknown launch kind");
}

}  // namespace pipit
