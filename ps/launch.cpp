#include "ps/launch.h"

#include <map>
#include <random>

#include "comm/control.h"
#include "ps/messages.h"
#include "ps/package.h"
#include "ps/shard_plan.h"

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

// Each shard its parameters; returns what each will answer when Ready and when done.
void send_shards(TcpCommunicator& comm, const Module& model, const PsConfig& config,
                 const std::vector<std::string>& addresses, std::map<int, MessageKind>& ready,
                 std::map<int, MessageKind>& done) {
  const NamedParameters all = model.named_parameters();
  const std::vector<int> shard_of = plan_shards(all, config.servers);
  for (int s = 0; s < config.servers; ++s) {
    PsPackage package;
    package.role = "shard";
    package.index = s;
    package.sharing = roles_on_host(addresses, config.server_id(s));
    package.config = config;
    for (const auto& [name, p] : shard_parameters(all, shard_of, s)) {
      package.weights.emplace(name, p.detach());
    }
    comm.send(config.server_id(s), to_message(package));
    ready[config.server_id(s)] = MessageKind::Ready;
    done[config.server_id(s)] = MessageKind::State;
  }
}

// Each worker the model's config, the shards' addresses and its data.
void send_workers(TcpCommunicator& comm, const Module& model, const PsConfig& config,
                  const std::vector<PsWorkerData>& data, int64_t batch, int64_t steps,
                  const std::vector<std::string>& addresses, std::map<int, MessageKind>& done) {
  const std::vector<std::string> shard_addresses(addresses.begin(),
                                                 addresses.begin() + config.servers);
  for (int w = 0; w < config.workers; ++w) {
    PsPackage package;
    package.role = "worker";
    package.index = w;
    package.sharing = roles_on_host(addresses, config.worker_id(w));
    package.config = config;
    package.model = model.config();
    package.shards = shard_addresses;
    package.inputs = data[static_cast<size_t>(w)].inputs;
    package.targets = data[static_cast<size_t>(w)].targets;
    package.batch = batch;
    package.steps = steps;
    comm.send(config.worker_id(w), to_message(package));
    done[config.worker_id(w)] = PsKind::Leave;
  }
}

}  // namespace

PsLaunchResult train_ps_on_workers(const Module& model, const PsConfig& config,
                                   const std::vector<PsWorkerData>& data, int64_t batch,
                                   int64_t steps, const std::vector<std::string>& addresses,
                                   TcpOptions tcp) {
  validate(config);
  const int roles = config.servers + config.workers;
  PIPIT_CHECK(static_cast<int>(addresses.size()) == roles, "train_ps_on_workers: ", config.servers,
              " shards and ", config.workers, " workers need ", roles,
              " pipit-worker addresses, got ", addresses.size());
  PIPIT_CHECK(static_cast<int>(data.size()) == config.workers, "train_ps_on_workers: ", data.size(),
              " data shards for ", config.workers, " workers");
  if (tcp.session.empty()) {
    std::random_device device;
    tcp.session = "ps-" + std::to_string(device()) + "-" + std::to_string(device());
  }
  auto comm = std::make_shared<TcpCommunicator>(kCoordinator, tcp);
  PsLaunchResult result;
  try {
    for (int id = 0; id < roles; ++id) {
      const auto [host, port] = parse_endpoint(addresses[static_cast<size_t>(id)]);
      comm->connect(id, host, port);
    }
    std::map<int, MessageKind> shards_ready, done;
    send_shards(*comm, model, config, addresses, shards_ready, done);
    await_all(*comm, config, shards_ready, addresses);
    send_workers(*comm, model, config, data, batch, steps, addresses, done);
    // A worker says Ready, trains, and says PsLeave; a fast one may be done before a slow one
    // is Ready, so the launcher waits only for the ends: every worker's PsLeave, every
    // shard's State.
    await_all(*comm, config, done, addresses, [&](const Message& m) {
      if (m.kind != MessageKind::State) return;
      const StateReply reply = read_state_reply(m);
      size_t next = 0;
      for (const std::string& name : reply.weights) result.weights[name] = m.tensors[next++];
      for (const std::string& name : reply.optimizer) {
        result.optimizer_state[name] = m.tensors[next++];
      }
      if (m.from == config.server_id(0)) result.version = m.step;
    });
  } catch (...) {
    for (int id = 0; id < roles; ++id) comm->send(id, Message(MessageKind::Shutdown, 0));
    comm->close();
    throw;
  }
  comm->close();
  return result;
}

}  // namespace pipit
