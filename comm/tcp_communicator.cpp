#include "comm/tcp_communicator.h"

#include <asio.hpp>
#include <atomic>
#include <deque>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "comm/handshake.h"
#include "comm/inbox.h"
#include "serialize/atomic_file.h"

namespace pipit {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

std::string endpoint_text(const tcp::endpoint& endpoint) {
  return endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
}

}  // namespace

std::string read_token_file(const std::string& path) {
  std::string token = read_file(path);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  PIPIT_CHECK(!token.empty(), "token file '", path, "' holds an empty token");
  return token;
}

std::pair<std::string, uint16_t> parse_endpoint(const std::string& text) {
  const size_t colon = text.rfind(':');
  PIPIT_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < text.size(), "endpoint '",
              text, "' is not host:port");
  const std::string port_text = text.substr(colon + 1);
  PIPIT_CHECK(port_text.find_first_not_of("0123456789") == std::string::npos &&
                  port_text.size() <= 5 && std::stoul(port_text) <= 65535,
              "endpoint '", text, "' has a bad port '", port_text, "'");
  return {text.substr(0, colon), static_cast<uint16_t>(std::stoul(port_text))};
}

struct Connection {
  explicit Connection(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::string address;
  int peer = 0;
  bool peer_known = false;  // outgoing connections know their peer before the handshake
  int announced_id = 0;     // the id the peer gave in its Hello, which its proof is bound to
  bool hello_received = false;
  bool ready = false;  // handshake complete: frames go to the inbox
  bool closed = false;
  bool close_after_write = false;
  std::string nonce;       // the challenge we sent
  std::string peer_nonce;  // the challenge we answer
  std::string peer_session;
  std::deque<EncodedFrame> queue;
  bool writing = false;
  Clock::time_point opened = Clock::now(), last_received = Clock::now(), last_sent = Clock::now();
  uint8_t header_bytes[kFrameHeaderSize] = {};
  FrameHeader header;
  std::string json, body_prefix;
  std::vector<Tensor> tensors;               // the frame being received
  std::vector<asio::mutable_buffer> pieces;  // its bytes still to come
  size_t remaining = 0;
  std::shared_ptr<std::promise<std::string>> handshake_result;  // connect() waits on it
};

struct TcpCommunicator::Impl {
  Impl(int id, TcpOptions options)
      : options(std::move(options)), id(id), inbox("tcp endpoint " + std::to_string(id)) {
    if (!this->options.log) {
      this->options.log = [](const std::string& line) { std::cerr << line << std::endl; };
    }
    thread = std::thread([this] { io.run(); });
    asio::post(io, [this] { tick(); });
  }

  TcpOptions options;
  std::atomic<int> id;
  Inbox inbox;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread;
  std::unique_ptr<tcp::acceptor> acceptor;
  asio::steady_timer timer{io};
  std::set<std::shared_ptr<Connection>> connections;  // io thread only
  std::atomic<size_t> open_connections{0};
  std::atomic<bool> closing{false};
  mutable std::mutex session_mutex;
  std::string session_text;
  std::string session() const {
    std::lock_guard<std::mutex> lock(session_mutex);
    return session_text;
  }
  mutable std::mutex addresses_mutex;
  std::map<int, std::string> addresses;
  std::map<int, std::string> dialed;  // peer -> the address connect() reached it at

  void log(const std::string& line) {
    options.log("[tcp " + std::to_string(id.load()) + "] " + line);
  }

  // --- io thread ---

  void start(const std::shared_ptr<Connection>& conn) {
    connections.insert(conn);
    ++open_connections;
    asio::error_code ignored;
    conn->socket.set_option(tcp::no_delay(true), ignored);
    // Room for a whole activation in the kernel's send buffer means fewer writable wake-ups
    // per large frame; the kernel caps it at net.core.wmem_max.
    conn->socket.set_option(asio::socket_base::send_buffer_size(4 << 20), ignored);
    conn->nonce = random_nonce();
    queue_frame(conn, encode_frame_parts(hello_message(id.load(), conn->nonce, session())));
    read_header(conn);
  }

  void close_connection(const std::shared_ptr<Connection>& conn, const std::string& reason) {
    if (conn->closed) return;
    conn->closed = true;
    // Logged before the socket closes, so the line exists by the time the peer sees the close.
    if (!closing) {
      log("closed connection " +
          (conn->ready ? "to peer " + std::to_string(conn->peer) + " " : "") + conn->address +
          ": " + reason);
    }
    asio::error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    connections.erase(conn);
    --open_connections;
    if (conn->handshake_result) {
      // A connection that drops during the handshake without a verdict (a worker's listener
      // closing at the end of a run, with ours in its backlog or just accepted) is retried by
      // connect() like a refused one; a handshake refused on its merits is final.
      const bool verdict = reason.rfind("handshake refused", 0) == 0;
      conn->handshake_result->set_value(verdict ? reason : "refused:" + reason);
      conn->handshake_result.reset();
    }
    if (closing) return;
    if (conn->ready) {
      Message lost(MessageKind::PeerLost, -1);
      lost.from = conn->peer;
      // Name the peer by the address it listens on (which we dialed) when we know it: the
      // address of a connection it opened is just an ephemeral port.
      lost.meta = {{"peer", conn->peer},
                   {"address", listening_address(conn->peer, conn->address)},
                   {"reason", reason}};
      inbox.push(std::move(lost));
    }
  }

  std::string listening_address(int peer, const std::string& fallback) {
    std::lock_guard<std::mutex> lock(addresses_mutex);
    auto it = dialed.find(peer);
    return it == dialed.end() ? fallback : it->second;
  }

  void read_header(const std::shared_ptr<Connection>& conn) {
    asio::async_read(conn->socket, asio::buffer(conn->header_bytes),
                     [this, conn](const asio::error_code& ec, size_t) {
                       if (ec) return close_connection(conn, describe(ec, "between frames"));
                       try {
                         conn->header = decode_frame_header(conn->header_bytes, options.limits);
                       } catch (const FrameError& e) {
                         return close_connection(conn, e.what());
                       }
                       conn->json.resize(conn->header.header_length);
                       asio::async_read(conn->socket, asio::buffer(conn->json),
                                        [this, conn](const asio::error_code& ec2, size_t) {
                                          if (ec2) {
                                            return close_connection(conn,
                                                                    describe(ec2, "mid-frame"));
                                          }
                                          read_body(conn);
                                        });
                     });
  }

  // The body goes straight into the message's tensors: its prefix (the tensor header) is
  // read and validated first, then the tensor bytes land in freshly allocated tensors.
  void read_body(const std::shared_ptr<Connection>& conn) {
    if (conn->header.body_length == 0) return finish_frame(conn, {});
    conn->body_prefix.resize(8);
    asio::async_read(
        conn->socket, asio::buffer(conn->body_prefix),
        [this, conn](const asio::error_code& ec, size_t) {
          if (ec) return close_connection(conn, describe(ec, "mid-frame"));
          size_t prefix = 0;
          try {
            prefix = frame_body_prefix_length(
                conn->header, reinterpret_cast<const uint8_t*>(conn->body_prefix.data()));
          } catch (const FrameError& e) {
            return close_connection(conn, e.what());
          }
          conn->body_prefix.resize(prefix);
          asio::async_read(conn->socket, asio::buffer(conn->body_prefix.data() + 8, prefix - 8),
                           [this, conn](const asio::error_code& ec2, size_t) {
                             if (ec2) return close_connection(conn, describe(ec2, "mid-frame"));
                             read_tensors(conn);
                           });
        });
  }

  void read_tensors(const std::shared_ptr<Connection>& conn) {
    try {
      conn->tensors = plan_frame_body(conn->header, conn->body_prefix);
    } catch (const FrameError& e) {
      return close_connection(conn, e.what());
    }
    conn->pieces.clear();
    conn->remaining = 0;
    for (const Tensor& t : conn->tensors) {
      if (t.nbytes() == 0) continue;
      conn->pieces.push_back(asio::buffer(t.raw_data(), t.nbytes()));
      conn->remaining += t.nbytes();
    }
    read_tensor_bytes(conn);
  }

  // Reads the tensor bytes in pieces. The kernel would wake this thread for every 64 KiB
  // that arrives; a receive low-water mark lets it wake once per kLargeRead (or for the
  // frame's last bytes), which keeps large transfers near raw socket speed.
  void read_tensor_bytes(const std::shared_ptr<Connection>& conn) {
    constexpr size_t kLargeRead = 1 << 20;
    asio::error_code ignored;
    if (conn->remaining == 0) {
      conn->socket.set_option(asio::socket_base::receive_low_watermark(1), ignored);
      return finish_frame(conn, std::move(conn->tensors));
    }
    conn->socket.set_option(asio::socket_base::receive_low_watermark(
                                static_cast<int>(std::min(conn->remaining, kLargeRead))),
                            ignored);
    conn->socket.async_read_some(
        conn->pieces, [this, conn](const asio::error_code& ec, size_t bytes) {
          if (ec) return close_connection(conn, describe(ec, "mid-frame"));
          conn->remaining -= bytes;
          while (bytes > 0) {  // drop what was filled from the front of the piece list
            asio::mutable_buffer& front = conn->pieces.front();
            if (bytes < front.size()) {
              front += bytes;
              break;
            }
            bytes -= front.size();
            conn->pieces.erase(conn->pieces.begin());
          }
          read_tensor_bytes(conn);
        });
  }

  void finish_frame(const std::shared_ptr<Connection>& conn, std::vector<Tensor> tensors) {
    Message message;
    try {
      message = decode_frame_message(conn->header, conn->json, std::move(tensors));
    } catch (const Error& e) {
      return close_connection(conn, e.what());
    }
    conn->last_received = Clock::now();
    if (!on_message(conn, std::move(message))) return;
    read_header(conn);
  }

  static std::string describe(const asio::error_code& ec, const char* where) {
    if (ec == asio::error::eof) return std::string("peer closed the connection ") + where;
    return std::string("read failed ") + where + ": " + ec.message();
  }

  // Returns false when the connection was closed.
  bool on_message(const std::shared_ptr<Connection>& conn, Message message) {
    if (!conn->ready) return handshake(conn, message);
    switch (message.kind) {
      case MessageKind::Heartbeat:
        return true;
      case MessageKind::Hello:
      case MessageKind::PeerLost:
        close_connection(conn, std::string("unexpected ") + message_kind_name(message.kind) +
                                   " frame after the handshake");
        return false;
      default:
        message.from = conn->peer;
        inbox.push(std::move(message));
        return true;
    }
  }

  // Both sides send Hello{version, id, nonce}. The connecting side then proves the token
  // over the acceptor's nonce; the acceptor checks that proof and admits the peer before it
  // answers with its own proof (or a refusal), so a refused peer never believes it is
  // connected. Each side is ready once it has checked the other's proof.
  // The protocol is in comm/handshake.h; this drives it over one connection.
  bool handshake(const std::shared_ptr<Connection>& conn, const Message& message) {
    auto fail = [&](const std::string& reason) {
      close_connection(conn, "handshake refused: " + reason);
      return false;
    };
    if (message.kind != MessageKind::Hello) {
      return fail(std::string("expected Hello, got ") + message_kind_name(message.kind));
    }
    if (auto reason = refusal_reason(message.meta)) return fail("refused by the peer: " + *reason);
    if (!conn->hello_received) {
      Hello hello;
      try {
        hello = parse_hello(message.meta);
      } catch (const Error& e) {
        return fail(e.what());
      }
      conn->hello_received = true;
      conn->announced_id = hello.id;
      conn->peer_nonce = hello.nonce;
      conn->peer_session = hello.session;
      if (!conn->peer_known) conn->peer = hello.id;
      if (conn->peer_known) send_proof(conn);
      return true;
    }
    if (!proof_is_valid(message.meta, options.token, conn->nonce, conn->announced_id)) {
      return fail("the peer did not prove the shared token (wrong or missing --token-file?)");
    }
    if (!conn->peer_known) {
      const std::string refusal =
          options.admit ? options.admit(conn->announced_id, conn->peer_session) : "";
      if (!refusal.empty()) {
        log("refused peer " + std::to_string(conn->announced_id) + " at " + conn->address + ": " +
            refusal);
        conn->close_after_write = true;
        queue_frame(conn, encode_frame_parts(refusal_message(refusal)));
        return false;
      }
      send_proof(conn);
    }
    conn->ready = true;
    {
      std::lock_guard<std::mutex> lock(addresses_mutex);
      addresses[conn->peer] = conn->address;
    }
    log("connected to peer " + std::to_string(conn->peer) + " at " + conn->address);
    if (conn->handshake_result) {
      conn->handshake_result->set_value("");
      conn->handshake_result.reset();
    }
    return true;
  }

  void send_proof(const std::shared_ptr<Connection>& conn) {
    queue_frame(conn,
                encode_frame_parts(proof_message(options.token, conn->peer_nonce, id.load())));
  }

  void queue_frame(const std::shared_ptr<Connection>& conn, EncodedFrame frame) {
    if (conn->closed) return;
    conn->queue.push_back(std::move(frame));
    if (!conn->writing) write_next(conn);
  }

  void write_next(const std::shared_ptr<Connection>& conn) {
    if (conn->queue.empty()) {
      conn->writing = false;
      if (conn->close_after_write) close_connection(conn, "closed by this side");
      return;
    }
    conn->writing = true;
    const EncodedFrame& frame = conn->queue.front();
    std::vector<asio::const_buffer> buffers{asio::buffer(frame.prefix)};
    for (const auto& [data, size] : frame.tensor_bytes) buffers.push_back(asio::buffer(data, size));
    // Asio's default completion condition caps every write at 64 KiB; a frame goes in as few
    // system calls as the socket buffer allows.
    auto whole_frame = [](const asio::error_code& ec, size_t) -> size_t {
      return ec ? 0 : size_t{1} << 30;
    };
    asio::async_write(conn->socket, buffers, whole_frame,
                      [this, conn](const asio::error_code& ec, size_t) {
                        if (ec) return close_connection(conn, "write failed: " + ec.message());
                        conn->queue.pop_front();
                        conn->last_sent = Clock::now();
                        write_next(conn);
                      });
  }

  std::shared_ptr<Connection> route(int peer) {
    std::shared_ptr<Connection> incoming;
    for (const auto& conn : connections) {
      if (!conn->ready || conn->peer != peer) continue;
      if (conn->peer_known) return conn;  // our own connect() to this peer
      incoming = conn;
    }
    return incoming;
  }

  void accept() {
    acceptor->async_accept([this](const asio::error_code& ec, tcp::socket socket) {
      if (ec) {
        if (ec != asio::error::operation_aborted) log("accept failed: " + ec.message());
        if (!acceptor->is_open() || closing) return;
      } else {
        auto conn = std::make_shared<Connection>(std::move(socket));
        asio::error_code remote_ec;
        conn->address = endpoint_text(conn->socket.remote_endpoint(remote_ec));
        start(conn);
      }
      accept();
    });
  }

  void tick() {
    if (closing) return;
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Connection>> all(connections.begin(), connections.end());
    for (const auto& conn : all) {
      if (!conn->ready && now - conn->opened > options.peer_timeout) {
        close_connection(
            conn, "no handshake within " + std::to_string(options.peer_timeout.count()) + " ms");
      } else if (conn->ready && now - conn->last_received > options.peer_timeout) {
        close_connection(conn, "no frame or heartbeat for " +
                                   std::to_string(options.peer_timeout.count()) + " ms");
      } else if (conn->ready && !conn->writing &&
                 now - conn->last_sent >= options.heartbeat_interval) {
        queue_frame(conn, encode_frame_parts(Message(MessageKind::Heartbeat, 0)));
      }
    }
    timer.expires_after(options.heartbeat_interval / 4);
    timer.async_wait([this](const asio::error_code& ec) {
      if (!ec) tick();
    });
  }
};

TcpCommunicator::TcpCommunicator(int id, TcpOptions options)
    : impl_(std::make_unique<Impl>(id, std::move(options))) {
  set_session(impl_->options.session);
}

TcpCommunicator::~TcpCommunicator() {
  close();
}

int TcpCommunicator::id() const {
  return impl_->id.load();
}

void TcpCommunicator::set_id(int id) {
  impl_->id = id;
}

void TcpCommunicator::set_session(const std::string& session) {
  std::lock_guard<std::mutex> lock(impl_->session_mutex);
  impl_->session_text = session;
}

uint16_t TcpCommunicator::listen(const std::string& host, uint16_t port) {
  asio::error_code ec;
  const asio::ip::address address =
      asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  PIPIT_CHECK(!ec, "listen: '", host, "' is not an IP address");
  auto acceptor = std::make_unique<tcp::acceptor>(impl_->io);
  const tcp::endpoint endpoint(address, port);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  PIPIT_CHECK(!ec, "listen on ", host, ":", port, " failed: ", ec.message());
  const uint16_t bound = acceptor->local_endpoint().port();
  std::promise<void> started;
  asio::post(impl_->io, [this, &acceptor, &started] {
    impl_->acceptor = std::move(acceptor);
    impl_->accept();
    started.set_value();
  });
  started.get_future().wait();
  impl_->log("listening on " + host + ":" + std::to_string(bound));
  return bound;
}

void TcpCommunicator::connect(int peer, const std::string& host, uint16_t port) {
  const std::string where = host + ":" + std::to_string(port);
  {
    std::lock_guard<std::mutex> lock(impl_->addresses_mutex);
    impl_->dialed[peer] = where;
  }
  const auto deadline = Clock::now() + impl_->options.connect_timeout;
  asio::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  PIPIT_CHECK(!ec && !endpoints.empty(), "connect: cannot resolve '", host, "': ", ec.message());
  const tcp::endpoint endpoint = *endpoints.begin();
  while (true) {
    auto result = std::make_shared<std::promise<std::string>>();
    std::future<std::string> outcome = result->get_future();
    asio::post(impl_->io, [this, peer, endpoint, where, result] {
      auto socket = std::make_shared<tcp::socket>(impl_->io);
      socket->async_connect(endpoint,
                            [this, peer, where, result, socket](const asio::error_code& e) {
                              if (e) return result->set_value("refused:" + e.message());
                              auto conn = std::make_shared<Connection>(std::move(*socket));
                              conn->address = where;
                              conn->peer = peer;
                              conn->peer_known = true;
                              conn->handshake_result = result;
                              impl_->start(conn);
                            });
    });
    const auto left = deadline - Clock::now();
    if (outcome.wait_for(std::max(left, Clock::duration::zero())) != std::future_status::ready) {
      throw Error("connect to " + where + ": no handshake within " +
                  std::to_string(impl_->options.connect_timeout.count()) + " ms");
    }
    const std::string error = outcome.get();
    if (error.empty()) return;
    const bool retry = error.rfind("refused:", 0) == 0 ||
                       error.find("refused by the peer: busy") != std::string::npos;
    if (retry && Clock::now() + std::chrono::milliseconds(100) < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    throw Error("connect to " + where +
                " failed: " + (error.rfind("refused:", 0) == 0 ? error.substr(8) : error));
  }
}

std::string TcpCommunicator::peer_address(int peer) const {
  std::lock_guard<std::mutex> lock(impl_->addresses_mutex);
  auto it = impl_->addresses.find(peer);
  return it == impl_->addresses.end() ? "" : it->second;
}

void TcpCommunicator::send(int peer, Message message) {
  if (peer == id()) {
    message.from = peer;
    impl_->inbox.push(std::move(message));
    return;
  }
  auto frame = std::make_shared<EncodedFrame>(encode_frame_parts(message));
  asio::post(impl_->io, [this, peer, frame] {
    std::shared_ptr<Connection> conn = impl_->route(peer);
    if (conn) return impl_->queue_frame(conn, std::move(*frame));
    if (impl_->closing) return;
    impl_->log("send: no connection to peer " + std::to_string(peer));
    Message lost(MessageKind::PeerLost, -1);
    lost.from = peer;
    lost.meta = {{"peer", peer}, {"address", ""}, {"reason", "no connection to this peer"}};
    impl_->inbox.push(std::move(lost));
  });
}

Message TcpCommunicator::receive() {
  return impl_->inbox.pop();
}

std::optional<Message> TcpCommunicator::try_receive(std::chrono::milliseconds timeout) {
  return impl_->inbox.pop_for(timeout);
}

void TcpCommunicator::close() {
  if (impl_->closing.exchange(true)) return;
  // Frames already queued (a Shutdown, say) are written before their connection closes.
  asio::post(impl_->io, [this] {
    asio::error_code ignored;
    if (impl_->acceptor) impl_->acceptor->close(ignored);
    impl_->timer.cancel();
    std::vector<std::shared_ptr<Connection>> all(impl_->connections.begin(),
                                                 impl_->connections.end());
    for (const auto& conn : all) {
      if (conn->writing) {
        conn->close_after_write = true;
      } else {
        impl_->close_connection(conn, "closed by this side");
      }
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (impl_->open_connections > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  impl_->work.reset();
  impl_->io.stop();
  impl_->thread.join();
  impl_->inbox.close();
}

}  // namespace pipit
