// What unauthenticated peers can cost a pipit-worker (with a token): its resident memory and
// descriptors while (1) peers announce huge frames before the handshake, (2) many peers stall
// mid-handshake, then (3) whether it still serves a real coordinator; and (4) floods of idle
// connections, each reopened the moment the worker closes it (and one not reopened), against
// a worker with default flags: how long a coordinator with default flags takes from start to
// its first trained step, and what the worker's memory, threads and descriptors do meanwhile.
// Prints markdown tables for docs/RELIABILITY.md.
//   hostile_peers [--connections 256] [--handshake-timeout-ms 2000] [--floods 600,5000]
#include <sys/resource.h>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <string>
#include <thread>
#include <vector>

#include "codec/atomic_file.h"
#include "comm/asio.h"
#include "comm/frame.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "support/connection_flood.h"
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
    if (ec) std::this_thread::sleep_for(1ms);  // else the worker's Hello: read on
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

// 3. Whether a real coordinator (default flags and the worker's token) still gets served: a
// line saying so, or "FAILED: why".
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

// 4. A flood of `connections` idle connections against a worker with default flags; the
// coordinator starts once the worker has closed as many as the flood holds (its table is full
// and the flood renews), and its time to the first trained step is measured.
void flood_row(int connections, bool renew) {
  support::WorkerProcess worker({.pipit_worker = true, .token = "sesame"});
  const long idle_rss = status_kib(worker.pid(), "VmRSS");
  support::ConnectionFlood flood("127.0.0.1", worker.port(), connections, renew);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (flood.opened() < connections && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(500ms);
  const auto start = std::chrono::steady_clock::now();
  const std::string outcome = real_coordinator_outcome(worker.port());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "| %d %s | %ld | %ld | %ld | %ld | %ld | %.2f s | %s; the flood had %lld connects, "
      "%lld closed by the worker |\n",
      connections, renew ? "renewed" : "once", idle_rss, status_kib(worker.pid(), "VmRSS"),
      status_kib(worker.pid(), "VmHWM"), status_kib(worker.pid(), "Threads"),
      open_fds(worker.pid()), seconds, outcome.c_str(), static_cast<long long>(flood.opened()),
      static_cast<long long>(flood.closed_by_peer()));
  std::fflush(stdout);
}

// Each flood connection is a descriptor of this process.
void raise_descriptor_limit(int connections) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  PIPIT_CHECK(limit.rlim_cur >= static_cast<rlim_t>(connections) + 256,
              "hostile_peers: a flood of ", connections,
              " connections needs more descriptors than this process may open (", limit.rlim_cur,
              "; raise it with ulimit -n)");
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("hostile_peers", "Memory and descriptors a worker spends on hostile peers.");
  flags.add("connections", "256", "stalled unauthenticated connections to open");
  flags.add("handshake-timeout-ms", "2000", "the worker's handshake deadline");
  flags.add("floods", "600,5000", "sizes of the renewed floods against a default worker");
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
  row("stalled handshakes held",
      std::to_string(connections) + " opened, " + std::to_string(refused_now) +
          " closed soon after (the oldest silent ones, making room past the pending cap)");
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

  std::printf(
      "\n| flood | idle VmRSS KiB | VmRSS KiB | VmHWM KiB | threads | open fds | "
      "coordinator's first step | outcome |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<int> floods;
  for (const std::string& size : flags.items("floods")) {
    floods.push_back(std::stoi(size));
  }
  for (const int connections : floods) {
    raise_descriptor_limit(connections);
    flood_row(connections, true);
  }
  flood_row(floods.empty() ? 600 : floods.front(), false);
  return outcome.rfind("FAILED", 0) == 0 ? 1 : 0;
}
