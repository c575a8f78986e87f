#include "comm/tcp_connection.h"

namespace pipit {

TcpConnection::TcpConnection(asio::ip::tcp::socket socket, std::string address, bool dialed,
                             Handshake handshake, FrameLimits limits,
                             const ConnectionEvents& events)
    : socket_(std::move(socket)),
      address_(std::move(address)),
      handshake_(std::move(handshake)),
      limits_(limits),
      events_(events),
      reader_(socket_, [this] { progressed_ = true; }),
      writer_(
          socket_,
          [this] {
            if (!reason_after_write_.empty()) close(reason_after_write_);
          },
          [this](const std::string& reason) { close(reason); }),
      dialed_(dialed) {}

void TcpConnection::start() {
  asio::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  // Room for a whole activation in the kernel's send buffer means fewer writable wake-ups
  // per large frame; the kernel caps it at net.core.wmem_max.
  socket_.set_option(asio::socket_base::send_buffer_size(4 << 20), ignored);
  send(encode_frame_parts(handshake_.hello()));
  read_next();
}

void TcpConnection::read_next() {
  if (closed_) return;
  auto self = shared_from_this();
  reader_.read(
      ready() ? limits_ : kHandshakeLimits, self,
      [this, self](Message message) {
        // A handler that throws must cost only this connection, never the io thread.
        try {
          on_frame(std::move(message));
        } catch (const std::exception& e) {
          close(std::string("error handling a frame: ") + e.what());
        }
      },
      [this, self](const std::string& reason) { close(reason); });
}

void TcpConnection::on_frame(Message message) {
  last_received_ = Clock::now();
  ++frames_received_;
  if (!ready()) {
    Handshake::Step step = handshake_.on_message(message, events_.admit);
    const bool refused = step.state == Handshake::State::Refused;
    // Reported before the refusal goes out: the peer may act on it at once.
    if (refused && !step.replies.empty()) events_.on_refusing(shared_from_this(), step.reason);
    for (Message& reply : step.replies) send(encode_frame_parts(reply));
    if (refused) {
      // A refusal we send is written before the socket closes, so the peer learns why.
      if (step.replies.empty()) {
        close("handshake refused: " + step.reason);
      } else {
        close_after_write("handshake refused: " + step.reason);
      }
      return;
    }
    if (step.state == Handshake::State::Connected) events_.on_ready(shared_from_this());
    return read_next();
  }
  switch (message.kind) {
    case MessageKind::Heartbeat:
      break;
    case MessageKind::Hello:
    case MessageKind::PeerLost:
      close(std::string("unexpected ") + message_kind_name(message.kind) +
            " frame after the handshake");
      return;
    default:
      message.from = peer();
      events_.on_message(shared_from_this(), std::move(message));
  }
  read_next();
}

void TcpConnection::send(EncodedFrame frame) {
  writer_.send(std::move(frame), shared_from_this());
}

void TcpConnection::close_after_write(std::string reason) {
  reason_after_write_ = std::move(reason);
  if (!writer_.busy()) close(reason_after_write_);
}

void TcpConnection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  // Reported (and logged) before the socket closes, so the line exists by the time the peer
  // sees the close.
  auto self = shared_from_this();
  events_.on_closed(self, reason, handshake_.state() == Handshake::State::Refused);
  writer_.stop();
  asio::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

bool TcpConnection::has_progress() {
  asio::error_code ec;
  const size_t available = closed_ ? 0 : socket_.available(ec);
  if (!ec && available != seen_available_) {
    seen_available_ = available;
    progressed_ = true;
  }
  const bool progressed = progressed_;
  progressed_ = false;
  if (progressed) last_received_ = Clock::now();
  return progressed;
}

}  // namespace pipit
