#include "pipeline/worker.h"

#include <memory>
#include <set>

#include "pipeline/stage.h"
#include "pipeline/stage_package.h"
#include "serialize/atomic_file.h"

namespace pipit {
namespace {

constexpr int kUnassigned = -2;  // a worker's endpoint id before it knows its stage

// Builds the stage from the package and connects to its neighbours; replies READY or, when
// anything is wrong with the package, a StageError naming it.
std::unique_ptr<Stage> build_stage(const std::shared_ptr<TcpCommunicator>& comm,
                                   const Message& message, const TcpOptions& options) {
  StagePackage package = stage_package_from_message(message, "stage package from the coordinator");
  comm->set_id(package.stage);
  auto stage = std::make_unique<Stage>(build_stage_spec(package), comm);
  const int p = package.stages, s = package.stage;
  std::set<int> neighbours;
  if (p > 1) neighbours = {(s + 1) % p, (s + p - 1) % p};
  for (int peer : neighbours) {
    const std::string key = std::to_string(peer);
    PIPIT_CHECK(package.peers.contains(key) && package.peers[key].is_string(),
                "stage package: no address for neighbouring stage ", peer);
    auto [host, port] = parse_endpoint(package.peers[key].get<std::string>());
    comm->connect(peer, host, port);
  }
  options.log("[worker] stage " + std::to_string(s) + " of " + std::to_string(p) + " ready (" +
              std::to_string(package.chunks_per_stage) + " chunks, " + package.schedule + ")");
  return stage;
}

}  // namespace

void run_worker(const WorkerOptions& options) {
  TcpOptions tcp = options.tcp;
  if (!tcp.log)
    tcp.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  auto [host, port] = parse_endpoint(options.listen);
  for (int run = 0; options.runs < 0 || run < options.runs; ++run) {
    // One coordinator per run, and stages only of its run: a coordinator or stage of another
    // run that reaches this listener (this run lasting, or being torn down) is told to
    // retry, and finds the next run's listener instead.
    auto run_session = std::make_shared<std::string>();
    TcpOptions run_tcp = tcp;
    run_tcp.admit = [run_session](int peer, const std::string& session) -> std::string {
      if (peer == kCoordinator) {
        if (!run_session->empty()) return "busy: this worker is serving another run";
        if (session.empty()) return "a coordinator must name its run (session)";
        *run_session = session;
        return "";
      }
      // The coordinator claims every worker before it sends any stage package, so a stage
      // of this run always finds the session set; any other session is a stale run.
      if (session.empty() || session != *run_session) return "not in this run";
      return "";
    };
    auto comm = std::make_shared<TcpCommunicator>(kUnassigned, run_tcp);
    // Later runs listen on the port the first one bound, so coordinators find the worker again.
    port = comm->listen(host, port);
    if (run == 0 && !options.port_file.empty()) {
      write_file_atomic(options.port_file, std::to_string(port) + "\n");
    }
    tcp.log("[worker] waiting for a coordinator on " + host + ":" + std::to_string(port));
    std::unique_ptr<Stage> stage;
    while (!stage) {
      Message message = comm->receive();
      if (message.kind != MessageKind::StagePackage || message.from != kCoordinator) continue;
      try {
        // run_session is written on the io thread before the coordinator's messages arrive.
        comm->set_session(*run_session);
        stage = build_stage(comm, message, tcp);
        comm->send(kCoordinator, Message(MessageKind::Ready, 0));
      } catch (const std::exception& e) {
        tcp.log(std::string("[worker] refused the stage package: ") + e.what());
        Message error(MessageKind::StageError, 0);
        error.meta = {{"message", std::string("worker ") + options.listen +
                                      " could not build its stage: " + e.what()}};
        comm->send(kCoordinator, std::move(error));
        break;
      }
    }
    if (stage) {
      stage->run();
      tcp.log("[worker] run finished");
    }
    comm->close();
  }
}

}  // namespace pipit
