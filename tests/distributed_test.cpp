// Pipelines over real worker processes on 127.0.0.1: the same parameters as in-process,
// faults reported by stage and endpoint, and bad input refused without harm.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <asio.hpp>

#include "comm/frame.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipeline/distributed_pipeline.h"
#include "pipeline/pipeline.h"
#include "pipeline/stage_package.h"
#include "pipit.h"
#include "serialize/atomic_file.h"
#include "serialize/checkpoint.h"

extern char** environ;

using namespace pipit;
namespace fs = std::filesystem;

namespace {

// A worker process started from this test executable (see tests/main.cpp).
class WorkerProcess {
 public:
  explicit WorkerProcess(const std::string& token = "") {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("pipit_worker_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    const std::string port_file = (dir_ / "port").string(), log = (dir_ / "log").string();
    std::vector<std::string> args = {exe, "--worker", "127.0.0.1:0", port_file};
    if (!token.empty()) args.push_back(token);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(port_file) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(fs::exists(port_file));
    port_ = static_cast<uint16_t>(std::stoi(read_file(port_file)));
  }
  ~WorkerProcess() {
    kill();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  std::string log() const { return read_file((dir_ / "log").string()); }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

struct Batch {
  Tensor input, target;
};

std::shared_ptr<Sequential> small_gpt(int64_t layers = 6) {
  Generator generator(5);
  return gpt({11, 6, layers, 2, 16, 0.0}, &generator);
}

Batch gpt_batch() {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < 8 * 6; ++i) {
    x.push_back((i * 7) % 11);
    y.push_back((i * 7 + 3) % 11);
  }
  return {from_vector(x, {8, 6}), from_vector(y, {8, 6})};
}

PipelineConfig config_for(const std::string& schedule, int v) {
  PipelineConfig config;
  config.stages = 4;
  config.microbatches = 4;
  config.chunks_per_stage = v;
  config.schedule = schedule;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  config.timeout = std::chrono::milliseconds(20000);
  return config;
}

std::string logs(const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  std::string out;
  for (size_t i = 0; i < workers.size(); ++i) {
    out += "--- worker " + std::to_string(i) + " log:\n" + workers[i]->log();
  }
  return out;
}

std::vector<std::string> endpoints(const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  std::vector<std::string> out;
  for (const auto& w : workers) out.push_back(w->endpoint());
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
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
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(std::make_unique<WorkerProcess>());
  const Batch batch = gpt_batch();
  for (const auto& [schedule, v] :
       std::vector<std::pair<std::string, int>>{{"gpipe", 1}, {"1f1b", 1}, {"interleaved", 2}}) {
    INFO(schedule);
    auto local_model = small_gpt();
    std::vector<double> local_losses, remote_losses;
    {
      Pipeline pipeline(local_model, config_for(schedule, v));
      for (int step = 0; step < 3; ++step) {
        local_losses.push_back(pipeline.train_step(batch.input, batch.target));
      }
    }
    auto remote_model = small_gpt();
    StateDict weights;
    {
      DistributedPipeline pipeline(*remote_model, config_for(schedule, v), endpoints(workers));
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
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < 64 * 32; ++i) {
    x.push_back((i * 7) % 11);
    y.push_back((i * 5 + 1) % 11);
  }
  const Batch batch{from_vector(x, {64, 32}), from_vector(y, {64, 32})};
  const PipelineConfig config = config_for("1f1b", 1);

  // The run that never stops: 4 steps in-process.
  auto uninterrupted = make_model();
  {
    Pipeline pipeline(uninterrupted, config);
    for (int step = 0; step < 4; ++step) pipeline.train_step(batch.input, batch.target);
  }

  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(std::make_unique<WorkerProcess>());
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(2000);
  const std::string path =
      (fs::temp_directory_path() / ("pipit_resume_" + std::to_string(getpid()) + ".safetensors"))
          .string();
  auto model = make_model();
  {
    DistributedPipeline pipeline(*model, config, endpoints(workers), tcp);
    const auto first = std::chrono::steady_clock::now();
    pipeline.train_step(batch.input, batch.target);
    REQUIRE(std::chrono::steady_clock::now() - first > std::chrono::milliseconds(60));
    pipeline.train_step(batch.input, batch.target);
    auto [weights, optimizer_state] = pipeline.coordinator().fetch_state();
    save_checkpoint(path, {model->config(), weights, config.optimizer, optimizer_state, 2, 0, 0});

    const std::string victim = workers[2]->endpoint();
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
  workers[2] = std::make_unique<WorkerProcess>();
  Checkpoint checkpoint = load_checkpoint(path);
  fs::remove(path);
  auto resumed = std::dynamic_pointer_cast<Sequential>(build_module(checkpoint.model_config));
  REQUIRE(resumed != nullptr);
  resumed->load_state_dict(checkpoint.weights);
  DistributedPipeline pipeline(*resumed, config, endpoints(workers), tcp,
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
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 2; ++i) workers.push_back(std::make_unique<WorkerProcess>());
  auto model = small_gpt(2);
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  TcpOptions tcp;
  tcp.heartbeat_interval = std::chrono::milliseconds(100);
  tcp.peer_timeout = std::chrono::milliseconds(800);
  DistributedPipeline pipeline(*model, config, endpoints(workers), tcp);
  const Batch batch = gpt_batch();
  pipeline.train_step(batch.input, batch.target);
  workers[1]->pause();  // SIGSTOP: the process and its connections go silent
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(pipeline.train_step(batch.input, batch.target),
                    Catch::Contains("stage 1") && Catch::Contains(workers[1]->endpoint()) &&
                        Catch::Contains("heartbeat"));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= std::chrono::milliseconds(800));
  CHECK(waited < std::chrono::milliseconds(3000));
}

TEST_CASE("bad bytes on a worker port are refused and the worker keeps serving", "[distributed]") {
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  workers.push_back(std::make_unique<WorkerProcess>("sesame"));
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
  CHECK_THROWS_WITH(DistributedPipeline(*model, config, endpoints(workers), wrong),
                    Catch::Contains(workers[0]->endpoint()));
  CHECK_THAT(workers[0]->log(), Catch::Contains("did not prove the shared token"));

  TcpOptions right;
  right.token = "sesame";
  DistributedPipeline pipeline(*model, config, endpoints(workers), right);
  const Batch batch = gpt_batch();
  CHECK(std::isfinite(pipeline.train_step(batch.input, batch.target)));
}

namespace {
class UnregisteredLayer final : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  json config() const override { return {{"type", "UnregisteredLayer"}}; }
};
}  // namespace

TEST_CASE("a stage package the worker cannot build is reported, not crashed on", "[distributed]") {
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  workers.push_back(std::make_unique<WorkerProcess>());
  workers.push_back(std::make_unique<WorkerProcess>());
  auto model = small_gpt(2);
  model->push_back(std::make_shared<UnregisteredLayer>());
  PipelineConfig config = config_for("1f1b", 1);
  config.stages = 2;
  CHECK_THROWS_WITH(DistributedPipeline(*model, config, endpoints(workers)),
                    Catch::Contains("UnregisteredLayer") && Catch::Contains("stage 1"));
  // Both workers serve the next, valid run.
  auto good = small_gpt(2);
  DistributedPipeline pipeline(*good, config, endpoints(workers));
  const Batch batch = gpt_batch();
  INFO("worker 0 log:\n" << workers[0]->log() << "worker 1 log:\n" << workers[1]->log());
  CHECK(std::isfinite(pipeline.train_step(batch.input, batch.target)));
}

TEST_CASE("a stage package whose weights do not fit its layers is refused by name",
          "[distributed]") {
  WorkerProcess worker;
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
  CHECK(reply->kind == MessageKind::StageError);
  const std::string message = reply->meta.value("message", std::string());
  CHECK_THAT(message, Catch::Contains(victim) && Catch::Contains("[3, 3]"));
  CHECK_THAT(worker.log(), Catch::Contains("refused the stage package"));
}
