// Pipelines over real worker processes on 127.0.0.1: the same parameters as in-process,
// faults reported by stage and endpoint, and bad input refused without harm.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>
#include "comm/asio.h"

#include "codec/atomic_file.h"
#include "comm/frame.h"
#include "distributed_reference.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipeline/pipeline.h"
#include "pipeline/remote/stage_package.h"
#include "pipit.h"
#include "serialize/checkpoint.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;

namespace {

// The loss of one step of small_gpt(2) on gpt_batch() in threads: what a fresh distributed
// run must return bit for bit.
double in_process_loss(const PipelineConfig& config) {
  Pipeline pipeline(small_gpt(2), config);
  const Batch batch = gpt_batch();
  return pipeline.train_step(batch.input, batch.target);
}

// Options that give up dialing after `connect_timeout` and log nothing, in the session
// `session` (empty: the default one).
TcpOptions quiet_options(std::chrono::milliseconds connect_timeout,
                         const std::string& session = "") {
  TcpOptions options;
  options.connect_timeout = connect_timeout;
  options.log = [](const std::string&) {};
  if (!session.empty()) options.session = session;
  return options;
}

// A fresh pipeline of small_gpt(2) over `workers` trains a step to the in-process loss: what
// the workers do once whatever came before has released them.
void check_trains_as_in_process(const Workers& workers, const PipelineConfig& config,
                                const TcpOptions& options) {
  Pipeline pipeline(small_gpt(2), config, Launch::workers(endpoints(workers), options));
  const Batch batch = gpt_batch();
  INFO(logs(workers));
  CHECK(pipeline.train_step(batch.input, batch.target) == in_process_loss(config));
}

// Sends raw bytes to a worker's port and waits until the worker closes the connection.
void send_raw(uint16_t port, const std::string& bytes) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(socket, asio::buffer(bytes));
  asio::error_code ec;
  socket.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  char sink[4096];
  while (!ec) socket.read_some(asio::buffer(sink), ec);
}

}  // namespace

TEST_CASE("training over 4 worker processes equals training in-process, bit for bit",
          "[distributed]") {
  Workers workers = start_workers(4, test_worker());
  const Batch batch = gpt_batch();
  struct Case {
    std::string schedule;
    int v;
    std::string recompute = "none";
  };
  for (const auto& [schedule, v, recompute] : std::vector<Case>{{"gpipe", 1},
                                                                {"1f1b", 1},
                                                                {"interleaved", 2},
                                                                {"zbh1", 1},
                                                                {"zbh2", 1},
                                                                {"zbv", 2},
                                                                {"zbh1", 1, "full"},
                                                                {"zbh2", 1, "full"},
                                                                {"zbv", 2, "full"},
                                                                {"interleaved", 2, "full"}}) {
    INFO(schedule << " recompute " << recompute);
    auto local_model = small_gpt();
    std::vector<double> local_losses, remote_losses;
    {
      Pipeline pipeline(local_model, config_for(schedule, v, recompute));
      for (int step = 0; step < 3; ++step) {
        local_losses.push_back(pipeline.train_step(batch.input, batch.target));
      }
    }
    auto remote_model = small_gpt();
    StateDict weights;
    {
      Pipeline pipeline(remote_model, config_for(schedule, v, recompute),
                        Launch::workers(endpoints(workers)));
      INFO(logs(workers));
      for (int step = 0; step < 3; ++step) {
        remote_losses.push_back(pipeline.train_step(batch.input, batch.target));
      }
      weights = pipeline.coordinator().fetch_state().first;
    }
    CHECK(remote_losses == local_losses);
    const StateDict expected = local_model->state_dict();
    REQUIRE(weights.size() == expected.size());
    for (const auto& [name, value] : expected) {
      INFO(name);
      CHECK(bitwise_equal(weights.at(name), value));
    }
  }
}

TEST_CASE(
    "a worker killed mid-step fails the step, and resuming from a checkpoint continues exactly",
    "[distributed]") {
  // Big enough that a step lasts well beyond the 30 ms after which the worker is killed.
  auto make_model = [] {
    Generator g(9);
    return gpt({11, 32, 6, 2, 64, 0.0}, &g);
  };
  const Batch batch = testing::sequence_batch(64, 32, {.target_step = 5, .target_offset = 1});
  const PipelineConfig config = config_for("1f1b", 1);

  // The run that never stops: 4 steps in-process.
  auto uninterrupted = make_model();
  {
    Pipeline pipeline(uninterrupted, config);
    for (int step = 0; step < 4; ++step) pipeline.train_step(batch.input, batch.target);
  }

  Workers workers = start_workers(4, test_worker());
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(2000);
  const std::string path =
      (fs::temp_directory_path() / ("pipit_resume_" + std::to_string(getpid()) + ".safetensors"))
          .string();
  auto model = make_model();
  {
    Pipeline pipeline(model, config, Launch::workers(endpoints(workers), tcp));
    pipeline.train_step(batch.input, batch.target);
    pipeline.train_step(batch.input, batch.target);
    auto [weights, optimizer_state] = pipeline.coordinator().fetch_state();
    save_checkpoint(path, {model->config(), weights, config.optimizer, optimizer_state, 2, 0, 0});

    const std::string victim = workers[2]->endpoint();
    // Frozen before the step begins, the victim cannot finish it: the kill lands mid-step on
    // any machine, however fast or loaded.
    workers[2]->pause();
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      workers[2]->kill();
    });
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(pipeline.train_step(batch.input, batch.target),
                      Catch::Contains("stage 2") && Catch::Contains(victim));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    killer.join();
  }

  // The survivors went back to waiting; with a new worker for stage 2 the run resumes from
  // the checkpoint and ends where the uninterrupted run ended, bit for bit.
  workers[2] = std::make_unique<WorkerProcess>(test_worker());
  Checkpoint checkpoint = load_checkpoint(path);
  fs::remove(path);
  auto resumed = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
  REQUIRE(resumed != nullptr);
  resumed->load_state_dict(checkpoint.weights);
  Pipeline pipeline(resumed, config, Launch::workers(endpoints(workers), tcp),
                    checkpoint.optimizer_state);
  INFO(logs(workers));
  for (int64_t step = checkpoint.step; step < 4; ++step) {
    pipeline.train_step(batch.input, batch.target);
  }
  const StateDict weights = pipeline.coordinator().fetch_state().first;
  for (const auto& [name, value] : uninterrupted->state_dict()) {
    INFO(name);
    CHECK(bitwise_equal(weights.at(name), value));
  }
}

TEST_CASE("a worker that stops answering is reported within the heartbeat timeout",
          "[distributed]") {
  Workers workers = start_workers(2, test_worker());
  auto model = small_gpt(2);
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  TcpOptions tcp;
  tcp.heartbeat_interval = std::chrono::milliseconds(100);
  tcp.peer_timeout = std::chrono::milliseconds(800);
  Pipeline pipeline(model, config, Launch::workers(endpoints(workers), tcp));
  const Batch batch = gpt_batch();
  pipeline.train_step(batch.input, batch.target);
  workers[1]->pause();  // SIGSTOP: the process and its connections go silent
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(pipeline.train_step(batch.input, batch.target),
                    Catch::Contains("stage 1") && Catch::Contains(workers[1]->endpoint()) &&
                        Catch::Contains("heartbeat"));
  // No lower bound: the 800 ms count from the last byte received, which may precede start.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(3000));
}

TEST_CASE("bad bytes on a worker port are refused and the worker keeps serving", "[distributed]") {
  Workers workers = start_workers(1, test_worker("sesame"));
  const uint16_t port = workers[0]->port();

  std::string random_bytes(300, '\0');
  for (size_t i = 0; i < random_bytes.size(); ++i) random_bytes[i] = static_cast<char>(i * 37 + 11);
  send_raw(port, random_bytes);

  std::string frame = encode_frame(Message(MessageKind::Hello, 0));
  std::string bad_magic = frame;
  bad_magic[0] = 'X';
  send_raw(port, bad_magic);

  std::string oversized = frame;
  for (int i = 16; i < 24; ++i) oversized[static_cast<size_t>(i)] = '\x7f';
  send_raw(port, oversized);

  std::string unknown_kind = frame;
  unknown_kind[6] = static_cast<char>(200);
  send_raw(port, unknown_kind);

  send_raw(port, frame.substr(0, frame.size() - 3));  // truncated, then the peer hangs up

  const std::string log = workers[0]->log();
  CHECK_THAT(log, Catch::Contains("magic"));
  CHECK_THAT(log, Catch::Contains("body"));
  CHECK_THAT(log, Catch::Contains("kind"));
  CHECK_THAT(log, Catch::Contains("mid-frame"));

  auto model = small_gpt(2);
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 1;
  TcpOptions wrong;
  wrong.token = "open";
  wrong.connect_timeout = std::chrono::milliseconds(3000);
  CHECK_THROWS_WITH(Pipeline(model, config, Launch::workers(endpoints(workers), wrong)),
                    Catch::Contains(workers[0]->endpoint()));
  CHECK_THAT(workers[0]->log(), Catch::Contains("did not prove the shared token"));

  TcpOptions right;
  right.token = "sesame";
  Pipeline pipeline(model, config, Launch::workers(endpoints(workers), right));
  const Batch batch = gpt_batch();
  CHECK(pipeline.train_step(batch.input, batch.target) == in_process_loss(config));
}

namespace {
class UnregisteredLayer final : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  json config() const override { return {{"type", "UnregisteredLayer"}}; }
};
}  // namespace

TEST_CASE("a stage package the worker cannot build is reported, not crashed on", "[distributed]") {
  Workers workers = start_workers(2, test_worker());
  auto model = small_gpt(2);
  model->push_back(std::make_shared<UnregisteredLayer>());
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  CHECK_THROWS_WITH(Pipeline(model, config, Launch::workers(endpoints(workers))),
                    Catch::Contains("UnregisteredLayer") && Catch::Contains("stage 1"));
  // Both workers serve the next, valid run.
  auto good = small_gpt(2);
  Pipeline pipeline(good, config, Launch::workers(endpoints(workers)));
  const Batch batch = gpt_batch();
  INFO("worker 0 log:\n" << workers[0]->log() << "worker 1 log:\n" << workers[1]->log());
  CHECK(pipeline.train_step(batch.input, batch.target) == in_process_loss(config));
}

TEST_CASE("a stage package whose weights do not fit its layers is refused by name",
          "[distributed]") {
  WorkerProcess worker(test_worker());
  auto model = small_gpt(2);
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 1;
  StagePackage package = make_stage_package(*model, partition_model(*model, config), config, 0);
  const std::string victim = package.weights.begin()->first;
  package.weights[victim] = zeros({3, 3});

  TcpOptions options;
  options.session = "shape-test";
  TcpCommunicator coordinator(kCoordinator, options);
  coordinator.connect(0, "127.0.0.1", worker.port());
  coordinator.send(0, stage_package_message(package));
  std::optional<Message> reply = coordinator.try_receive(std::chrono::seconds(20));
  REQUIRE(reply.has_value());
  CHECK(reply->kind == MessageKind::RoleError);
  const std::string message = reply->meta.value("message", std::string());
  CHECK_THAT(message, Catch::Contains(victim) && Catch::Contains("[3, 3]"));
  CHECK_THAT(worker.log(), Catch::Contains("refused the stage package"));
}

TEST_CASE("a coordinator that claims workers and vanishes leaves them serving the next one",
          "[distributed]") {
  Workers workers = start_workers(1, test_worker());
  workers.push_back(std::make_unique<WorkerProcess>(test_worker("", {"--package-timeout-ms=300"})));
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  const auto connect_timeout = std::chrono::milliseconds(3000);
  {
    // Claims worker 0 and goes away without a stage package.
    TcpCommunicator coordinator(kCoordinator, quiet_options(connect_timeout, "vanishing"));
    coordinator.connect(0, "127.0.0.1", workers[0]->port());
  }
  // Claims worker 1, stays connected and sends nothing: the package deadline releases it.
  TcpCommunicator silent(kCoordinator, quiet_options(connect_timeout, "silent"));
  silent.connect(0, "127.0.0.1", workers[1]->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));

  check_trains_as_in_process(workers, config, quiet_options(connect_timeout));
  CHECK_THAT(workers[0]->log(), Catch::Contains("coordinator went away"));
  CHECK_THAT(workers[1]->log(), Catch::Contains("sent no stage package within 300 ms"));
}

TEST_CASE("a Pipeline over workers that cannot reach every one releases the ones it claimed",
          "[distributed]") {
  Workers workers = start_workers(2, test_worker());
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 3;
  const TcpOptions quick = quiet_options(std::chrono::milliseconds(1500));
  std::vector<std::string> three = endpoints(workers);
  three.push_back("127.0.0.1:1");  // nothing listens there
  CHECK_THROWS_WITH(Pipeline(small_gpt(3), config, Launch::workers(three, quick)),
                    Catch::Contains("127.0.0.1:1"));
  config.stages = 2;
  check_trains_as_in_process(workers, config, quick);
}

TEST_CASE("a worker waiting for its neighbour is released when its coordinator goes away",
          "[distributed]") {
  Workers workers = start_workers(2, test_worker());
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  const auto connect_timeout = std::chrono::milliseconds(3000);
  {
    // Claims both workers, gives only stage 1 its package (stage 1 then waits for stage 0 to
    // dial it, which never happens) and goes away.
    TcpCommunicator coordinator(kCoordinator, quiet_options(connect_timeout, "half-started"));
    coordinator.connect(0, "127.0.0.1", workers[0]->port());
    coordinator.connect(1, "127.0.0.1", workers[1]->port());
    auto model = small_gpt(2);
    StagePackage package = make_stage_package(*model, partition_model(*model, config), config, 1);
    package.peers = {{"0", workers[0]->endpoint()}, {"1", workers[1]->endpoint()}};
    coordinator.send(1, stage_package_message(package));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  // Within the 3 s connect timeout, far less than the worker's own 10 s: it stopped waiting.
  check_trains_as_in_process(workers, config, quiet_options(connect_timeout));
  CHECK_THAT(workers[1]->log(), Catch::Contains("stopped waiting for peer 0"));
}
