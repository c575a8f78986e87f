// TcpCommunicator against plain sockets on loopback, measured side by side in one run:
//  1. throughput of activation-sized messages (1, 4, 16, 64 MiB), pipit vs a blocking
//     send()/recv() pair moving the same bytes;
//  2. round-trip latency of a 64-byte message, pipit vs a raw ping-pong;
//  3. GPT training step time, 4 pipit-worker processes vs 4 in-process stages.
// Prints the tables and appends them to bench/RESULTS.md (--no-append to skip).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/tcp_communicator.h"
#include "nn/builders.h"
#include "pipeline/distributed_pipeline.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "serialize/atomic_file.h"

extern char** environ;

using namespace pipit;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// A connected pair of loopback TCP sockets with TCP_NODELAY, as the baseline uses them.
std::pair<int, int> socket_pair() {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "bind");
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  listen(listener, 1);
  int client = socket(AF_INET, SOCK_STREAM, 0);
  check(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "connect");
  int server = accept(listener, nullptr, nullptr);
  close(listener);
  int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {client, server};
}

void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, 0);
    check(n > 0, "send");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::recv(fd, data, size, 0);
    check(n > 0, "recv");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Bytes per second moving `count` messages of `size` bytes through raw sockets.
double raw_throughput(size_t size, int count) {
  auto [a, b] = socket_pair();
  std::vector<char> out(size, 1), in(size);
  auto start = Clock::now();
  std::thread receiver([&, b = b] {
    for (int i = 0; i < count; ++i) recv_all(b, in.data(), size);
  });
  for (int i = 0; i < count; ++i) send_all(a, out.data(), size);
  receiver.join();
  const double rate = static_cast<double>(size) * count / seconds_since(start);
  close(a);
  close(b);
  return rate;
}

struct CommPair {
  std::shared_ptr<TcpCommunicator> a, b;
};

CommPair connected_communicators() {
  TcpOptions options;
  options.log = [](const std::string&) {};
  CommPair pair{std::make_shared<TcpCommunicator>(0, options),
                std::make_shared<TcpCommunicator>(1, options)};
  const uint16_t port = pair.b->listen("127.0.0.1", 0);
  pair.a->connect(1, "127.0.0.1", port);
  // b answers through the connection a opened, once its handshake is through too.
  while (pair.b->peer_address(0).empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return pair;
}

double pipit_throughput(size_t size, int count) {
  CommPair pair = connected_communicators();
  Tensor payload = ones({static_cast<int64_t>(size / 4)});
  auto start = Clock::now();
  std::thread receiver([&] {
    for (int i = 0; i < count; ++i) pair.b->receive();
  });
  for (int i = 0; i < count; ++i) {
    pair.a->send(1, Message(MessageKind::Activation, 1, i, 0, {payload}));
  }
  receiver.join();
  return static_cast<double>(size) * count / seconds_since(start);
}

double raw_round_trip_us(int count) {
  auto [a, b] = socket_pair();
  char message[64] = {};
  std::thread echo([&, b = b] {
    char buffer[64];
    for (int i = 0; i < count; ++i) {
      recv_all(b, buffer, 64);
      send_all(b, buffer, 64);
    }
  });
  auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    send_all(a, message, 64);
    recv_all(a, message, 64);
  }
  const double us = seconds_since(start) * 1e6 / count;
  echo.join();
  close(a);
  close(b);
  return us;
}

double pipit_round_trip_us(int count) {
  CommPair pair = connected_communicators();
  Tensor payload = zeros({16});  // 64 bytes
  std::thread echo([&] {
    for (int i = 0; i < count; ++i) pair.b->send(0, pair.b->receive());
  });
  auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    pair.a->send(1, Message(MessageKind::Activation, 1, i, 0, {payload}));
    pair.a->receive();
  }
  const double us = seconds_since(start) * 1e6 / count;
  echo.join();
  return us;
}

struct Worker {
  pid_t pid;
  std::string endpoint;
};

Worker start_worker(const std::string& binary, const std::string& dir, int index) {
  const std::string port_file = dir + "/port" + std::to_string(index);
  std::vector<std::string> args = {binary,      "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--threads", "1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  check(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ) == 0, "spawn");
  posix_spawn_file_actions_destroy(&actions);
  while (!std::filesystem::exists(port_file))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return {pid, "127.0.0.1:" + std::to_string(std::stoi(read_file(port_file)))};
}

std::string gpt_step_table() {
  const std::string binary =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "pipit-worker").string();
  const std::string dir =
      std::filesystem::temp_directory_path() / ("pipit_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<Worker> workers;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(start_worker(binary, dir, i));
    endpoints.push_back(workers.back().endpoint);
  }
  std::vector<int64_t> tokens(16 * 64), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 7) % 65);
    targets[i] = static_cast<int64_t>((i * 7 + 3) % 65);
  }
  Tensor x = from_vector(tokens, {16, 64}), y = from_vector(targets, {16, 64});
  PipelineConfig config;
  config.stages = 4;
  config.microbatches = 8;
  config.schedule = "1f1b";
  config.optimizer = {{"type", "AdamW"}, {"lr", 1e-3}};
  auto median_step_ms = [&](Coordinator& coordinator) {
    coordinator.train_step(x, y);
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      auto start = Clock::now();
      coordinator.train_step(x, y);
      ms.push_back(seconds_since(start) * 1000);
    }
    std::sort(ms.begin(), ms.end());
    return ms[2];
  };
  Generator generator(0);
  auto model = gpt({65, 64, 4, 4, 128, 0.0}, &generator);
  double local_ms = 0, remote_ms = 0;
  {
    Pipeline local(model, config);
    local_ms = median_step_ms(local.coordinator());
  }
  {
    TcpOptions tcp;
    tcp.log = [](const std::string&) {};
    DistributedPipeline remote(*model, config, endpoints, tcp);
    remote_ms = median_step_ms(remote.coordinator());
  }
  for (const Worker& w : workers) {
    kill(w.pid, SIGTERM);
    waitpid(w.pid, nullptr, 0);
  }
  std::filesystem::remove_all(dir);
  char row[256];
  std::snprintf(row, sizeof row, "| 4 in-process stages | %.1f |\n| 4 worker processes | %.1f |\n",
                local_ms, remote_ms);
  std::printf("%s", row);
  return std::string(
             "\nGPT step (vocab 65, context 64, 4 layers, width 128, batch 16, 1F1B, "
             "p = 4, m = 8, 1 thread per stage), median of 5 steps\n\n"
             "| stages | ms/step |\n| --- | --- |\n") +
         row;
}

}  // namespace

int main(int argc, char** argv) {
  const bool append = !(argc > 1 && std::strcmp(argv[1], "--no-append") == 0);
  set_num_threads(1);
  signal(SIGPIPE, SIG_IGN);
  std::ostringstream tables;
  tables << "Throughput on loopback, pipit TcpCommunicator vs blocking send()/recv() of the same "
            "bytes (median of 7 alternating rounds)\n\n| message MiB | raw MiB/s | pipit MiB/s | pipit / raw |\n"
            "| --- | --- | --- | --- |\n";
  for (size_t mib : {1, 4, 16, 64}) {
    const size_t size = mib << 20;
    const int count = static_cast<int>(std::max<size_t>(4, (512u << 20) / size));
    // Alternating rounds, so both see the same machine; the median of each.
    std::vector<double> raws, pipits;
    for (int round = 0; round < 7; ++round) {
      raws.push_back(raw_throughput(size, count));
      pipits.push_back(pipit_throughput(size, count));
    }
    std::sort(raws.begin(), raws.end());
    std::sort(pipits.begin(), pipits.end());
    const double raw = raws[3], pipit = pipits[3];
    char row[256];
    std::snprintf(row, sizeof row, "| %zu | %.0f | %.0f | %.2f |\n", mib, raw / (1 << 20),
                  pipit / (1 << 20), pipit / raw);
    std::printf("%s", row);
    std::fflush(stdout);
    tables << row;
  }
  const double raw_us = raw_round_trip_us(5000), pipit_us = pipit_round_trip_us(5000);
  char row[256];
  std::snprintf(row, sizeof row, "| %.1f | %.1f | %.2f |\n", raw_us, pipit_us, pipit_us / raw_us);
  std::printf("%s", row);
  tables << "\nRound trip of a 64-byte message (mean of 5000)\n\n"
            "| raw us | pipit us | pipit / raw |\n| --- | --- | --- |\n"
         << row;
  tables << gpt_step_table();
  if (append) {
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
    std::ofstream results(std::string(PIPIT_SOURCE_DIR) + "/bench/RESULTS.md", std::ios::app);
    results << "\n## tcp_throughput, " << date << ", " << std::thread::hardware_concurrency()
            << " cores, loopback\n\n"
            << tables.str();
  }
  return 0;
}
