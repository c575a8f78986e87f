#pragma once
// A flood of idle connections, as a hostile peer on a worker's network would open them: each
// sends half a frame header and then nothing, and (renewed) is opened again the moment the
// other side closes it. One thread drives them all without blocking. Where the tests and
// bench/hostile_peers check that a real peer still gets in.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/asio.h"
#include "comm/frame.h"

namespace pipit::support {

class ConnectionFlood {
 public:
  ConnectionFlood(const std::string& host, uint16_t port, int connections, bool renew)
      : endpoint_(asio::ip::make_address(host), port), renew_(renew) {
    half_header_ = encode_frame(Message(MessageKind::Hello, 0)).substr(0, kFrameHeaderSize / 2);
    for (int i = 0; i < connections; ++i) slots_.push_back(std::make_unique<Slot>(io_));
    for (auto& slot : slots_) open(*slot);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ConnectionFlood() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  int64_t opened() const { return opened_; }  // connects that succeeded, reopenings included
  int64_t closed_by_peer() const { return closed_by_peer_; }

 private:
  struct Slot {
    explicit Slot(asio::io_context& io) : socket(io), retry(io) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer retry;
    char sink[64];
  };

  void open(Slot& slot) {
    asio::error_code ignored;
    slot.socket.close(ignored);
    slot.socket.async_connect(endpoint_, [this, &slot](const asio::error_code& ec) {
      if (ec) return open_later(slot);
      ++opened_;
      asio::async_write(slot.socket, asio::buffer(half_header_),
                        [this, &slot](const asio::error_code& e, size_t) {
                          if (e) return closed(slot);
                          wait_for_close(slot);
                        });
    });
  }

  // A refused or failed connect (the listener's backlog full, out of descriptors) is retried
  // soon rather than at once, which would only spin.
  void open_later(Slot& slot) {
    slot.retry.expires_after(std::chrono::milliseconds(1));
    slot.retry.async_wait([this, &slot](const asio::error_code& ec) {
      if (!ec) open(slot);
    });
  }

  void wait_for_close(Slot& slot) {
    slot.socket.async_read_some(asio::buffer(slot.sink),
                                [this, &slot](const asio::error_code& ec, size_t) {
                                  if (ec) return closed(slot);
                                  wait_for_close(slot);  // the Hello: read and ignored
                                });
  }

  void closed(Slot& slot) {
    ++closed_by_peer_;
    if (renew_) open(slot);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::ip::tcp::endpoint endpoint_;
  bool renew_;
  std::string half_header_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::atomic<int64_t> opened_{0}, closed_by_peer_{0};
  std::thread thread_;
};

}  // namespace pipit::support
