// What unauthenticated peers can cost a pipit-worker (with a token): its resident memory and
// descriptors while (1) peers announce huge frames before the handshake, (2) many peers stall
// mid-handshake, then (3) whether it still serves a real coordinator. Prints a markdown table
// for docs/RELIABILITY.md.
//   hostile_peers [--connections 256] [--handshake-timeout-ms 2000]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "codec/atomic_file.h"
#include "comm/asio.h"
#include "comm/frame.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/worker_process.h"

using namespace pipit;
using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

long status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

long open_fds(pid_t pid) {
  long n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++n;
  }
  return n;
}

std::string header_bytes(uint32_t header_length, uint64_t body_length) {
  std::string frame = encode_frame(Message(MessageKind::Hello, 0)).substr(0, kFrameHeaderSize);
  for (int i = 0; i < 4; ++i) frame[8 + i] = static_cast<char>((header_length >> (8 * i)) & 0xff);
  for (int i = 0; i < 8; ++i) frame[16 + i] = static_cast<char>((body_length >> (8 * i)) & 0xff);
  return frame;
}

// Whether the worker closed the socket within `wait`.
bool closed_by_peer(tcp::socket& socket, std::chrono::milliseconds wait) {
  socket.non_blocking(true);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char sink[256];
  while (std::chrono::steady_clock::now() < deadline) {
    asio::error_code ec;
    socket.read_some(asio::buffer(sink), ec);
    if (ec && ec != asio::error::would_block) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

// 1. Frames announcing 1 GiB bodies before the handshake: how many of 64 were refused from the
// fixed header at once.
int refused_huge_frames(asio::io_context& io, const tcp::endpoint& endpoint) {
  int refused = 0;
  for (int i = 0; i < 64; ++i) {
    tcp::socket socket(io);
    socket.connect(endpoint);
    asio::write(socket, asio::buffer(header_bytes(64, 1ull << 30)));
    refused += closed_by_peer(socket, 2000ms) ? 1 : 0;
  }
  return refused;
}

// 3. Whether a real coordinator still gets served: a line saying so, or "FAILED: why".
std::string real_coordinator_outcome(uint16_t port) {
  Generator generator(5);
  auto model = gpt({11, 6, 2, 2, 16, 0.0}, &generator);
  PipelineConfig config;
  config.stages = 1;
  config.microbatches = 2;
  TcpOptions tcp_options;
  tcp_options.token = "sesame";
  tcp_options.log = [](const std::string&) {};
  try {
    Pipeline pipeline(model, config,
                      Launch::workers({"127.0.0.1:" + std::to_string(port)}, tcp_options));
    std::vector<int64_t> tokens(4 * 6, 3);
    const Tensor x = from_vector(tokens, {4, 6});
    return "trained a step, loss " + std::to_string(pipeline.train_step(x, x));
  } catch (const std::exception& e) {
    return std::string("FAILED: ") + e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("hostile_peers", "Memory and descriptors a worker spends on hostile peers.");
  flags.add("connections", "256", "stalled unauthenticated connections to open");
  flags.add("handshake-timeout-ms", "2000", "the worker's handshake deadline");
  flags.parse(argc, argv);
  const int connections = static_cast<int>(flags.integer("connections"));
  support::WorkerProcess worker(
      {.pipit_worker = true,
       .flags = {"--handshake-timeout-ms", flags.str("handshake-timeout-ms")},
       .token = "sesame"});
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), worker.port());
  asio::io_context io;
  std::printf(
      "| phase | worker VmRSS KiB | VmHWM KiB | open fds | note |\n|---|---|---|---|---|\n");
  auto row = [&](const char* phase, const std::string& note) {
    std::printf("| %s | %ld | %ld | %ld | %s |\n", phase, status_kib(worker.pid(), "VmRSS"),
                status_kib(worker.pid(), "VmHWM"), open_fds(worker.pid()), note.c_str());
    std::fflush(stdout);
  };
  row("idle", "listening, token required");
  row("64 peers announced 1 GiB bodies",
      std::to_string(refused_huge_frames(io, endpoint)) + " of 64 closed at once");

  // 2. Stalled handshakes: a header announcing 4096 JSON bytes, 100 of them sent.
  std::vector<std::unique_ptr<tcp::socket>> stalled;
  for (int i = 0; i < connections; ++i) {
    auto socket = std::make_unique<tcp::socket>(io);
    socket->connect(endpoint);
    asio::write(*socket, asio::buffer(header_bytes(4096, 0) + std::string(100, '{')));
    stalled.push_back(std::move(socket));
  }
  std::this_thread::sleep_for(300ms);
  int refused_now = 0;
  for (auto& socket : stalled) refused_now += closed_by_peer(*socket, 1ms) ? 1 : 0;
  row("stalled handshakes held", std::to_string(connections) + " opened, " +
                                     std::to_string(refused_now) +
                                     " closed at once (over the pending cap)");
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(flags.integer("handshake-timeout-ms")) + 3s;
  int closed = refused_now;
  for (auto& socket : stalled) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    closed += closed_by_peer(*socket, std::max(left, 1ms)) ? 1 : 0;
  }
  closed -= refused_now;  // counted twice above for the refused ones
  row("after the handshake deadline",
      std::to_string(closed) + " of " + std::to_string(connections) + " closed by the worker");
  stalled.clear();

  const std::string outcome = real_coordinator_outcome(worker.port());
  row("then a real coordinator", outcome);
  return outcome.rfind("FAILED", 0) == 0 ? 1 : 0;
}
