#pragma once
// FaultProxy: a TCP forwarder on 127.0.0.1 in front of one worker. The chaos driver hands the
// proxy's address to the coordinator as the worker's, so the coordinator's connection and the
// neighbouring stage's both pass through it. Normally it passes bytes through; armed, it does
// one thing wrong, once:
//   cut    closes the connection at a byte inside a chosen part of a frame (mid-frame),
//   flip   XORs one byte inside a chosen part of a frame and forwards it,
//   stall  stops forwarding on every open connection for a while (the sockets stay open).
// Which part of which frame a byte belongs to comes from a FrameTracker per direction. One
// thread, poll(2), non-blocking sockets; every descriptor is close-on-exec.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tensor/error.h"
#include "tools/chaos/frame_tracker.h"

namespace pipit::chaos {

using Clock = std::chrono::steady_clock;

struct ProxyFault {
  enum class Kind { Cut, Flip, Stall };
  Kind kind = Kind::Cut;
  Region region = Region::TensorData;  // cut and flip: the part of a frame the byte lies in
  double fraction = 0.5;               // how far into that part, [0, 1)
  enum class Direction { Either, ToWorker, FromWorker } direction = Direction::Either;
  uint8_t mask = 0x5a;  // flip: the byte is XORed with this (nonzero)
  std::chrono::milliseconds stall{0};
};

struct ProxyEvent {
  Clock::time_point when;
  std::string what;
};

class FaultProxy {
 public:
  // Listens on 127.0.0.1 (any free port) and forwards each connection to target_port there.
  explicit FaultProxy(uint16_t target_port) : target_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    PIPIT_CHECK(listener_ >= 0, "chaos proxy: socket: ", std::strerror(errno));
    sockaddr_in address = loopback(0);
    PIPIT_CHECK(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                    listen(listener_, 64) == 0,
                "chaos proxy: cannot listen on 127.0.0.1: ", std::strerror(errno));
    socklen_t length = sizeof address;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~FaultProxy() {
    stop_ = true;
    thread_.join();
    for (Connection& c : connections_) close_connection(c);
    close(listener_);
  }
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // New connections go to this port (a restarted worker listens on a new one).
  void set_target(uint16_t port) { target_ = port; }
  // The fault happens once, on the next byte that matches it (a stall: at once).
  void arm(const ProxyFault& fault) {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = fault;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_.reset();
  }
  // The event of the last fault that fired, if it did since `since`.
  std::optional<ProxyEvent> fired_since(Clock::time_point since) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (last_ && last_->when >= since) return last_;
    return std::nullopt;
  }

 private:
  struct Pipe {  // one direction of a connection
    int from = -1, to = -1;
    bool to_worker = true;
    std::string buffer;  // read from `from`, not yet written to `to`
    size_t sent = 0;
    bool eof = false;   // `from` has no more bytes
    bool shut = false;  // the eof was passed on to `to`
    FrameTracker tracker;
  };
  struct Connection {
    int client = -1, server = -1;
    Pipe up, down;  // up: client -> worker, down: worker -> client
    bool dead = false;
    bool cut = false;  // close once the bytes before the cut are written
    Clock::time_point stalled_until{};
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
  }

  void accept_one() {
    const int client = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0) return;
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address = loopback(target_);
    // Loopback connects complete or fail at once; a refused one looks to the client like a
    // worker that closed during the handshake, which it retries.
    if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      if (server >= 0) close(server);
      close(client);
      return;
    }
    fcntl(server, F_SETFL, fcntl(server, F_GETFL) | O_NONBLOCK);
    const int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Connection& c = connections_.emplace_back();
    c.client = client, c.server = server;
    c.up.from = client, c.up.to = server, c.up.to_worker = true;
    c.down.from = server, c.down.to = client, c.down.to_worker = false;
  }

  // Who opened the connection, by the "id" in its Hello.
  static std::string dialer(const Connection& c) {
    const std::string& hello = c.up.tracker.first_json();
    size_t at = hello.find("\"id\"");
    if (at == std::string::npos) return "an unidentified peer";
    at = hello.find_first_not_of(" :", at + 4);
    const size_t end = hello.find_first_not_of("-0123456789", at);
    const std::string id = at == std::string::npos ? "" : hello.substr(at, end - at);
    if (id.empty()) return "an unidentified peer";
    return id == "-1" ? "the coordinator" : "stage " + id;
  }

  // Runs `armed` over freshly read bytes; returns how many of them to forward.
  size_t apply_fault(Connection& c, Pipe& pipe, char* bytes, size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool eligible =
        armed_ && armed_->kind != ProxyFault::Kind::Stall &&
        (armed_->direction == ProxyFault::Direction::Either ||
         (armed_->direction == ProxyFault::Direction::ToWorker) == pipe.to_worker);
    for (size_t i = 0; i < n; ++i) {
      const BytePosition p = pipe.tracker.feed(static_cast<uint8_t>(bytes[i]));
      if (!eligible || !armed_ || p.region != armed_->region || p.length == 0) continue;
      const auto target = std::min<uint64_t>(
          p.length - 1,
          static_cast<uint64_t>(std::floor(armed_->fraction * static_cast<double>(p.length))));
      if (p.offset != target) continue;
      const bool cut = armed_->kind == ProxyFault::Kind::Cut;
      const uint8_t mask = armed_->mask;
      last_ = ProxyEvent{
          Clock::now(),
          std::string(cut ? "cut before" : "flipped") + " byte " + std::to_string(p.offset) +
              " of " + std::to_string(p.length) + " of the " + region_name(p.region) + " of a " +
              kind_name(p.kind) + " frame going " +
              (pipe.to_worker ? "to the worker from " : "from the worker to ") + dialer(c)};
      armed_.reset();
      if (cut) {
        c.cut = true;
        return i;
      }
      bytes[i] = static_cast<char>(static_cast<uint8_t>(bytes[i]) ^ mask);
    }
    return n;
  }

  void read_some(Connection& c, Pipe& pipe) {
    char chunk[65536];
    const ssize_t n = read(pipe.from, chunk, sizeof chunk);
    if (n == 0) pipe.eof = true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
    if (n <= 0) return;
    const size_t keep = apply_fault(c, pipe, chunk, static_cast<size_t>(n));
    pipe.buffer.assign(chunk, keep);
    pipe.sent = 0;
  }

  void write_some(Connection& c, Pipe& pipe) {
    const ssize_t n =
        send(pipe.to, pipe.buffer.data() + pipe.sent, pipe.buffer.size() - pipe.sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
    if (n > 0) pipe.sent += static_cast<size_t>(n);
    if (pipe.sent == pipe.buffer.size()) pipe.buffer.clear(), pipe.sent = 0;
  }

  static void close_connection(Connection& c) {
    if (c.client >= 0) close(c.client);
    if (c.server >= 0) close(c.server);
    c.client = c.server = -1;
  }

  void loop() {
    while (!stop_) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (armed_ && armed_->kind == ProxyFault::Kind::Stall) {
          for (Connection& c : connections_) c.stalled_until = Clock::now() + armed_->stall;
          last_ = ProxyEvent{Clock::now(), "stalled " + std::to_string(connections_.size()) +
                                               " connections for " +
                                               std::to_string(armed_->stall.count()) + " ms"};
          armed_.reset();
        }
      }
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      std::vector<std::pair<Connection*, Pipe*>> owners = {{nullptr, nullptr}};
      const auto now = Clock::now();
      for (Connection& c : connections_) {
        if (c.stalled_until > now) continue;
        for (Pipe* pipe : {&c.up, &c.down}) {
          if (!pipe->buffer.empty()) {
            fds.push_back({pipe->to, POLLOUT, 0});
          } else if (!pipe->eof && !c.cut) {
            fds.push_back({pipe->from, POLLIN, 0});
          } else {
            continue;
          }
          owners.push_back({&c, pipe});
        }
      }
      if (poll(fds.data(), fds.size(), 20) < 0) continue;
      if (fds[0].revents & POLLIN) accept_one();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [c, pipe] = owners[i];
        if (fds[i].events == POLLOUT) {
          write_some(*c, *pipe);
        } else {
          read_some(*c, *pipe);
        }
      }
      for (auto it = connections_.begin(); it != connections_.end();) {
        Connection& c = *it;
        for (Pipe* pipe : {&c.up, &c.down}) {
          // A half closed by one side is passed on once its bytes are through.
          if (pipe->eof && pipe->buffer.empty() && !pipe->shut) {
            shutdown(pipe->to, SHUT_WR);
            pipe->shut = true;
          }
        }
        const bool drained = c.up.buffer.empty() && c.down.buffer.empty();
        if (c.dead || (c.cut && drained) || (c.up.eof && c.down.eof && drained)) {
          close_connection(c);
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<uint16_t> target_;
  std::atomic<bool> stop_{false};
  std::list<Connection> connections_;  // the proxy thread's only
  std::mutex mutex_;
  std::optional<ProxyFault> armed_;
  std::optional<ProxyEvent> last_;
  std::thread thread_;
};

}  // namespace pipit::chaos
