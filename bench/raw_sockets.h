#pragma once
// The raw-socket baseline of bench/tcp_throughput: blocking send()/recv() on a loopback pair,
// tuned to be a ceiling rather than a strawman. Large transfers get 4 MiB socket buffers, one
// send() and recv() of all that is left of the message and a receive low-water mark, so the
// receiver does not wake for every 64 KiB segment; small ones get TCP_NODELAY.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

namespace pipit::bench {

inline void check_os(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// A connected pair of loopback TCP sockets (client, server) with TCP_NODELAY.
inline std::pair<int, int> socket_pair(int buffer_bytes = 0) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check_os(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "bind");
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  listen(listener, 1);
  int client = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  for (int fd : {client, listener}) {
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Set before connecting, so the window scale is negotiated for the larger buffers.
    if (buffer_bytes > 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
    }
  }
  check_os(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "connect");
  int server = accept(listener, nullptr, nullptr);
  close(listener);
  return {client, server};
}

// Calls `transfer(next, left)`, one send() or recv() of the `left` bytes still to move from
// `next`, until all `size` bytes have moved.
template <typename Byte, typename Transfer>
void transfer_all(Byte* data, size_t size, const char* what, Transfer transfer) {
  while (size > 0) {
    const ssize_t n = transfer(data, size);
    check_os(n > 0, what);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

inline void send_all(int fd, const char* data, size_t size) {
  transfer_all(data, size, "send",
               [fd](const char* left, size_t bytes) { return ::send(fd, left, bytes, 0); });
}

inline void recv_all(int fd, char* data, size_t size) {
  transfer_all(data, size, "recv",
               [fd](char* left, size_t bytes) { return ::recv(fd, left, bytes, 0); });
}

// recv_all with a receive low-water mark of up to 1 MiB, so the reader wakes once per MiB
// rather than per segment. The mark never exceeds the bytes still expected (the kernel wakes
// a reader only once the mark's worth is queued, whatever it asked recv() for), and a mark
// not reached within a millisecond is dropped for that read: early in a connection the
// receive window can be smaller than the mark, and then the sender stops short of it.
inline void recv_all_batched(int fd, char* data, size_t size) {
  constexpr size_t kBatch = 1 << 20;
  int mark = 1;
  auto set_mark = [&](int bytes) {
    if (bytes == mark) return;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes);
    mark = bytes;
  };
  transfer_all(data, size, "recv", [&](char* left, size_t bytes) {
    set_mark(static_cast<int>(std::min(bytes, kBatch)));
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, 1) == 0) set_mark(1);
    return ::recv(fd, left, bytes, 0);
  });
  set_mark(1);
}

// Bytes per second moving `count` messages of `size` bytes from one thread to another.
inline double raw_throughput(size_t size, int count) {
  auto [a, b] = socket_pair(4 << 20);
  std::vector<char> out(size, 1), in(size);
  const auto start = std::chrono::steady_clock::now();
  std::thread receiver([&, b = b] {
    for (int i = 0; i < count; ++i) recv_all_batched(b, in.data(), size);
  });
  for (int i = 0; i < count; ++i) send_all(a, out.data(), size);
  receiver.join();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  close(a);
  close(b);
  return static_cast<double>(size) * count / took.count();
}

// Mean microseconds of a 64-byte ping-pong between two threads.
inline double raw_round_trip_us(int count) {
  auto [a, b] = socket_pair();
  char message[64] = {};
  std::thread echo([&, b = b] {
    char buffer[64];
    for (int i = 0; i < count; ++i) {
      recv_all(b, buffer, 64);
      send_all(b, buffer, 64);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    send_all(a, message, 64);
    recv_all(a, message, 64);
  }
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  echo.join();
  close(a);
  close(b);
  return took.count() / count;
}

}  // namespace pipit::bench
