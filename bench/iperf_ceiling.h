#pragma once
// iperf3's loopback throughput, the ceiling bench/tcp_throughput holds pipit's TCP transport
// against: a tool built to saturate a link, run on the same machine in the same run.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "bench/results.h"
#include "support/child_process.h"

namespace pipit::bench {

inline bool iperf3_installed() {
  return std::system("command -v iperf3 >/dev/null 2>&1") == 0;
}

// A loopback port free just now (iperf3's server takes no port 0).
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// Bytes per second received in one `seconds`-long iperf3 run on 127.0.0.1 with its default
// settings; nothing when iperf3 fails.
inline std::optional<double> iperf3_loopback(int seconds) {
  const std::string port = std::to_string(free_port());
  support::ChildProcess server({"iperf3", "-s", "-1", "-p", port}, "/dev/null", "/dev/null");
  std::optional<double> rate;
  // The server needs a moment to listen; a client that finds no one there is retried.
  for (int attempt = 0; attempt < 20 && !rate; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string command = "iperf3 -J -c 127.0.0.1 -p ";
    command += port;
    command += " -t ";
    command += std::to_string(seconds);
    command += " 2>/dev/null";
    const CommandOutput run = command_output(command);
    if (!run.ok) continue;
    std::string output;
    for (const std::string& line : run.lines) output += line;
    const auto report = nlohmann::json::parse(output, nullptr, false);
    if (report.is_discarded()) continue;
    rate = report["end"]["sum_received"]["bits_per_second"].get<double>() / 8;
  }
  return rate;
}

}  // namespace pipit::bench
