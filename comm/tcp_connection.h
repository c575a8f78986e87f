#pragma once
// TcpConnection: one connection of a TcpCommunicator: the socket, a FrameReader and a
// FrameWriter, the Handshake, and the clocks liveness is judged by. It lives on its io
// thread; only send() may be called from other threads. Until
// the handshake completes it reads with tiny limits (no tensors, small headers), so a peer
// that has not proved the token cannot make this side allocate.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include "comm/asio.h"

#include "comm/frame_reader.h"
#include "comm/frame_writer.h"
#include "comm/handshake.h"

namespace pipit {

// What a handshake frame may be at most: a Hello with its strings, no body.
constexpr FrameLimits kHandshakeLimits{4096, 0};

class TcpConnection;
using ConnectionPtr = std::shared_ptr<TcpConnection>;

// How a connection reports to its communicator (which outlives its connections).
struct ConnectionEvents {
  std::function<void(const ConnectionPtr&)> on_ready;
  std::function<void(const ConnectionPtr&, Message)> on_message;  // after the handshake
  // This side refuses the peer and tells it why (the connection closes once that is sent).
  std::function<void(const ConnectionPtr&, const std::string& reason)> on_refusing;
  // Once per connection, after its socket closed; `refused` when the handshake ended it.
  std::function<void(const ConnectionPtr&, const std::string& reason, bool refused)> on_closed;
  AdmitFunction admit;
};

class TcpConnection : public std::enable_shared_from_this<TcpConnection> {
 public:
  using Clock = std::chrono::steady_clock;

  // `dialed`: this side opened the connection (its handshake names the expected peer).
  TcpConnection(asio::ip::tcp::socket socket, std::string address, bool dialed, Handshake handshake,
                FrameLimits limits, const ConnectionEvents& events);

  // Sends the Hello and starts reading.
  void start();
  // Any thread: written at once by the calling thread when nothing is queued ahead of it.
  void send(EncodedFrame frame);
  // Idempotent; frames still queued are dropped.
  void close(const std::string& reason);
  // Closes with `reason` once the queued frames are written (at once when none are).
  void close_after_write(std::string reason = "closed by this side");

  bool ready() const { return handshake_.state() == Handshake::State::Connected; }
  bool closed() const { return closed_; }
  bool dialed() const { return dialed_; }
  int peer() const { return handshake_.peer(); }
  const std::string& address() const { return address_; }
  bool writing() const { return writer_.busy(); }

  // Whether bytes arrived since the last call: completed reads, or bytes waiting in the
  // kernel below the reader's low-water mark.
  bool has_progress();
  Clock::time_point opened() const { return opened_; }
  // Whole frames received: 0 for a peer that has not yet sent even its Hello.
  int64_t frames_received() const { return frames_received_; }
  Clock::time_point last_received() const { return last_received_; }
  Clock::time_point last_sent() const { return writer_.last_write(); }

 private:
  void read_next();
  void on_frame(Message message);

  asio::ip::tcp::socket socket_;
  std::string address_;
  Handshake handshake_;
  FrameLimits limits_;
  const ConnectionEvents& events_;
  FrameReader reader_;
  FrameWriter writer_;
  bool dialed_;
  bool closed_ = false;
  std::string reason_after_write_;  // set: close once the queue drains
  bool progressed_ = false;
  int64_t frames_received_ = 0;
  size_t seen_available_ = 0;
  Clock::time_point opened_ = Clock::now(), last_received_ = opened_;
};

}  // namespace pipit
