#include "pipeline/remote/host.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "codec/atomic_file.h"
#include "pipeline/gradients/replica_group.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/remote/stage_package.h"
#include "pipeline/stage.h"
#include "tensor/parallel.h"

namespace pipit {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUnassigned = -2;  // a worker's endpoint id before it knows its stage

// Which coordinator, if any, has claimed this run: written by admit on the io thread, read
// by the run loop.
struct Claim {
  std::mutex mutex;
  std::string session;
  std::optional<Clock::time_point> since;

  std::string admit(int peer, const std::string& session_name) {
    std::lock_guard<std::mutex> lock(mutex);
    if (peer == kCoordinator) {
      if (since) return "busy: this worker is serving another run";
      if (session_name.empty()) return "a coordinator must name its run (session)";
      session = session_name;
      since = Clock::now();
      return "";
    }
    // The coordinator claims every worker before it sends any stage package, so a stage of
    // this run always finds the session set; any other session is a stale run.
    if (session_name.empty() || session_name != session) return "not in this run";
    return "";
  }
  std::optional<Clock::time_point> claimed_since() {
    std::lock_guard<std::mutex> lock(mutex);
    return since;
  }
  std::string run_session() {
    std::lock_guard<std::mutex> lock(mutex);
    return session;
  }
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Builds the stage from the package and connects to its neighbouring stages: of each pair of
// neighbours the lower stage dials and the higher one waits, so two stages never open
// connections to each other at the same time.
// How many stages of the run, this one included, listen on this stage's host.
int stages_on_this_host(const StagePackage& package) {
  auto host_of = [&](int stage) -> std::optional<std::string> {
    const std::string key = std::to_string(stage);
    if (!package.peers.contains(key) || !package.peers[key].is_string()) return std::nullopt;
    try {
      return parse_endpoint(package.peers[key].get<std::string>()).first;
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  const int p = package.stages;
  const std::optional<std::string> mine =
      host_of(replica_endpoint(package.replica, package.stage, p));
  if (!mine) return 1;
  int sharing = 0;
  for (int e = 0; e < p * package.replicas; ++e) sharing += host_of(e) == mine ? 1 : 0;
  return std::max(1, sharing);
}

std::unique_ptr<Stage> build_stage(const std::shared_ptr<TcpCommunicator>& comm,
                                   const Message& message, const TcpOptions& options,
                                   double slowdown, int threads) {
  StagePackage package = stage_package_from_message(message, "stage package from the coordinator");
  const int p = package.stages, s = package.stage, r = package.replicas, k = package.replica;
  const int me = replica_endpoint(k, s, p);
  comm->set_id(me);
  StageSpec spec = build_stage_spec(package);
  spec.slowdown = slowdown;
  if (threads == 0) {
    const int sharing = stages_on_this_host(package);
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    set_num_threads(std::max(1, cores / sharing));
    options.log("[worker] " + std::to_string(sharing) + " stages of this run on this host: " +
                std::to_string(get_num_threads()) + " threads per kernel");
  }
  auto stage = std::make_unique<Stage>(std::move(spec), comm);
  // A coordinator that goes away while this stage waits for its neighbours ends the wait at
  // once: the worker must not stay claimed by a run that is over. (A failing
  // Pipeline on pipit-workers closes its connections after its Shutdown.)
  auto run_over = [&comm] { return !comm->is_connected(kCoordinator); };
  // The neighbouring stages of this replica (a ring, which ties between the first and the
  // last stage use too), and this stage in the neighbouring replicas (the gradient sum's
  // chain runs around them: replica_group.h).
  std::set<int> neighbours;
  if (p > 1)
    neighbours = {replica_endpoint(k, (s + 1) % p, p), replica_endpoint(k, (s + p - 1) % p, p)};
  if (r > 1) {
    neighbours.insert(replica_endpoint((k + 1) % r, s, p));
    neighbours.insert(replica_endpoint((k + r - 1) % r, s, p));
  }
  for (int peer : neighbours) {
    const std::string key = std::to_string(peer);
    PIPIT_CHECK(package.peers.contains(key) && package.peers[key].is_string(),
                "stage package: no address for neighbouring endpoint ", peer);
    const std::string address = package.peers[key].get<std::string>();
    comm->set_listening_address(peer, address);
    if (peer < me) continue;
    auto [host, port] = parse_endpoint(address);
    comm->connect(peer, host, port, run_over);
  }
  for (int peer : neighbours) {
    if (peer < me) comm->wait_for_peer(peer, options.connect_timeout, run_over);
  }
  options.log("[worker] stage " + std::to_string(s) + " of " + std::to_string(p) +
              (r > 1 ? ", replica " + std::to_string(k) + " of " + std::to_string(r) : "") +
              " ready (" + std::to_string(package.chunks_per_stage) + " chunks, " +
              package.schedule + ")");
  return stage;
}

// Waits for this run's stage package and builds the stage; nothing when the run ends first
// (the coordinator went away, told the worker to shut down, or sent no package in time), or
// when the package was another kind, which other_packages has served by then.
std::unique_ptr<Stage> await_stage(const std::shared_ptr<TcpCommunicator>& comm, Claim& claim,
                                   const HostOptions& options, const TcpOptions& tcp) {
  while (true) {
    std::optional<Message> message = comm->try_receive(std::chrono::milliseconds(100));
    if (!message) {
      const auto since = claim.claimed_since();
      if (since && Clock::now() - *since > options.package_timeout) {
        tcp.log("[worker] the coordinator claimed this worker but sent no stage package within " +
                std::to_string(options.package_timeout.count()) + " ms; waiting for a new one");
        return nullptr;
      }
      continue;
    }
    if (message->kind == MessageKind::PeerLost && message->from == kCoordinator) {
      tcp.log("[worker] the coordinator went away before the run started");
      return nullptr;
    }
    if (message->from != kCoordinator) continue;
    if (message->kind == MessageKind::Shutdown) {
      tcp.log("[worker] the coordinator ended the run before it started");
      return nullptr;
    }
    if (message->kind != PipelineKind::StagePackage) {
      const auto other = options.other_packages.find(message->kind);
      if (other == options.other_packages.end()) continue;
      comm->set_session(claim.run_session());
      try {
        other->second(comm, *message);
        tcp.log("[worker] run finished");
      } catch (const std::exception& e) {
        tcp.log(std::string("[worker] the run's role failed: ") + e.what());
        comm->send(kCoordinator,
                   to_message(RoleError{"pipit-worker " + options.listen,
                                        std::string("worker ") + options.listen + ": " + e.what()},
                              0));
      }
      return nullptr;
    }
    try {
      comm->set_session(claim.run_session());
      std::unique_ptr<Stage> stage =
          build_stage(comm, *message, tcp, options.slowdown, options.threads);
      comm->send(kCoordinator, Message(MessageKind::Ready, 0));
      return stage;
    } catch (const std::exception& e) {
      tcp.log(std::string("[worker] refused the stage package: ") + e.what());
      comm->send(kCoordinator, to_message(RoleError{"pipit-worker " + options.listen,
                                                    std::string("worker ") + options.listen +
                                                        " could not build its stage: " + e.what()},
                                          0));
      return nullptr;
    }
  }
}

}  // namespace

void run_host(const HostOptions& options) {
  TcpOptions tcp = options.tcp;
  if (!tcp.log) {
    tcp.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
  auto [host, port] = parse_endpoint(options.listen);
  if (tcp.token.empty() && !is_loopback(host)) {
    tcp.log("[worker] WARNING: listening on " + options.listen +
            " WITHOUT a token: anyone who can reach this address can run code in this "
            "worker's stage and read its weights. Give every process the same --token-file.");
  }
  for (int run = 0; options.runs < 0 || run < options.runs; ++run) {
    // One coordinator per run, and stages only of its run: a coordinator or stage of another
    // run that reaches this listener (this run lasting, or being torn down) is told to
    // retry, and finds the next run's listener instead.
    auto claim = std::make_shared<Claim>();
    TcpOptions run_tcp = tcp;
    run_tcp.admit = [claim](int peer, const std::string& session) {
      return claim->admit(peer, session);
    };
    auto comm = std::make_shared<TcpCommunicator>(kUnassigned, run_tcp);
    // Later runs listen on the port the first one bound, so coordinators find the worker again.
    port = comm->listen(host, port);
    if (run == 0 && !options.port_file.empty()) {
      write_file_atomic(options.port_file, std::to_string(port) + "\n");
    }
    tcp.log("[worker] waiting for a coordinator on " + host + ":" + std::to_string(port));
    std::unique_ptr<Stage> stage = await_stage(comm, *claim, options, tcp);
    if (stage) {
      stage->run();
      tcp.log("[worker] run finished");
    }
    comm->close();
  }
}

}  // namespace pipit
