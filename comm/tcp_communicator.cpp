#include "comm/tcp_communicator.h"

#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include "comm/asio.h"

#include "codec/atomic_file.h"
#include "comm/control.h"
#include "comm/inbox.h"
#include "comm/pending_connections.h"
#include "comm/tcp_connection.h"

namespace pipit {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

std::string endpoint_text(const tcp::endpoint& endpoint) {
  return endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
}

}  // namespace

std::string read_token_file(const std::string& path,
                            const std::function<void(const std::string&)>& warn) {
  std::string token = read_file(path);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  PIPIT_CHECK(!token.empty(), "token file '", path, "' holds an empty token");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && (info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    const std::string line = "WARNING: token file '" + path +
                             "' can be read by other users of this machine; "
                             "restrict it with: chmod 600 " +
                             path;
    if (warn) {
      warn(line);
    } else {
      std::cerr << line << std::endl;
    }
  }
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

struct TcpCommunicator::Impl {
  Impl(int id, TcpOptions options)
      : options(std::move(options)), id(id), inbox("tcp endpoint " + std::to_string(id)) {
    if (!this->options.log) {
      this->options.log = [](const std::string& line) { std::cerr << line << std::endl; };
    }
    events.on_ready = [this](const ConnectionPtr& conn) { on_ready(conn); };
    events.on_message = [this](const ConnectionPtr&, Message message) {
      inbox.push(std::move(message));
    };
    events.on_refusing = [this](const ConnectionPtr& conn, const std::string& reason) {
      log("refused peer " + std::to_string(conn->peer()) + " at " + conn->address() + ": " +
          reason);
    };
    events.on_closed = [this](const ConnectionPtr& conn, const std::string& reason, bool refused) {
      on_closed(conn, reason, refused);
    };
    events.admit = this->options.admit;
    thread = std::thread([this] { run_io(); });
    asio::post(io, [this] { tick(); });
  }

  TcpOptions options;
  std::atomic<int> id;
  Inbox inbox;
  ConnectionEvents events;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread;
  std::unique_ptr<tcp::acceptor> acceptor;
  asio::steady_timer timer{io};
  std::set<ConnectionPtr> connections;                          // io thread only
  PendingConnections pending{options.max_pending_connections};  // accepted, in their handshake
  asio::steady_timer accept_retry{io};
  // connect() waits on these: "" when connected, else why not ("retry:" when worth retrying).
  std::map<ConnectionPtr, std::shared_ptr<std::promise<std::string>>> dial_results;
  std::atomic<size_t> open_connections{0};
  std::atomic<bool> closing{false};
  mutable std::mutex session_mutex;
  std::string session_text;
  std::string session() const {
    std::lock_guard<std::mutex> lock(session_mutex);
    return session_text;
  }
  mutable std::mutex peers_mutex;
  std::condition_variable peer_ready;
  std::map<int, std::string> addresses;  // connected peers
  std::map<int, ConnectionPtr> routes;   // the connection send() writes to, per peer
  std::map<int, std::string> listening;  // peer -> the address it accepts connections on

  void log(const std::string& line) {
    options.log("[tcp " + std::to_string(id.load()) + "] " + line);
  }

  // The io thread. Connection handlers catch their own errors; this is the last barrier, so
  // that nothing a peer sends ends the thread (run() may be called again after a throw).
  void run_io() {
    while (true) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        log(std::string("io handler failed: ") + e.what());
      } catch (...) {
        log("io handler failed with an unknown exception");
      }
    }
  }

  // --- io thread ---

  ConnectionPtr start(tcp::socket socket, std::string address, std::optional<int> expected_peer) {
    auto conn = std::make_shared<TcpConnection>(
        std::move(socket), std::move(address), expected_peer.has_value(),
        Handshake(id.load(), session(), options.token, expected_peer), options.limits, events);
    connections.insert(conn);
    ++open_connections;
    if (!expected_peer) pending.add(conn);
    conn->start();
    return conn;
  }

  void on_ready(const ConnectionPtr& conn) {
    if (!conn->dialed()) pending.remove(conn);
    {
      std::lock_guard<std::mutex> lock(peers_mutex);
      addresses[conn->peer()] = conn->address();
      routes[conn->peer()] = route(conn->peer());
    }
    peer_ready.notify_all();
    log("connected to peer " + std::to_string(conn->peer()) + " at " + conn->address());
    auto result = dial_results.find(conn);
    if (result != dial_results.end()) {
      result->second->set_value("");
      dial_results.erase(result);
    }
  }

  void on_closed(const ConnectionPtr& conn, const std::string& reason, bool refused) {
    if (!conn->ready() && !conn->dialed()) pending.remove(conn);
    if (!closing && !pending.evicting()) {
      log("closed connection " +
          (conn->ready() ? "to peer " + std::to_string(conn->peer()) + " " : "") + conn->address() +
          ": " + reason);
    }
    connections.erase(conn);
    --open_connections;
    auto result = dial_results.find(conn);
    if (result != dial_results.end()) {
      // A connection that drops during the handshake without a verdict (a worker's listener
      // closing at the end of a run, with ours in its backlog or just accepted) is retried by
      // connect() like a refused one; a handshake refused on its merits is final.
      result->second->set_value(refused ? reason : "retry:" + reason);
      dial_results.erase(result);
    }
    if (!conn->ready()) return;
    {
      std::lock_guard<std::mutex> lock(peers_mutex);
      if (ConnectionPtr next = route(conn->peer())) {
        routes[conn->peer()] = next;
      } else {
        routes.erase(conn->peer());
        if (!closing) addresses.erase(conn->peer());
      }
    }
    if (closing) return;
    // Name the peer by the address it listens on (which we dialed) when we know it: the
    // address of a connection it opened is just an ephemeral port.
    inbox.push(to_message(
        PeerLost{conn->peer(), listening_address(conn->peer(), conn->address()), reason}));
  }

  std::string listening_address(int peer, const std::string& fallback) {
    std::lock_guard<std::mutex> lock(peers_mutex);
    auto it = listening.find(peer);
    return it == listening.end() ? fallback : it->second;
  }

  // The connection frames to `peer` go on: the one we dialed, else one the peer opened.
  ConnectionPtr route(int peer) {
    ConnectionPtr incoming;
    for (const auto& conn : connections) {
      if (!conn->ready() || conn->closed() || conn->peer() != peer) continue;
      if (conn->dialed()) return conn;
      incoming = conn;
    }
    return incoming;
  }

  void accept() {
    acceptor->async_accept([this](const asio::error_code& ec, tcp::socket socket) {
      if (ec) return accept_failed(ec);
      asio::error_code remote_ec;
      std::string address = endpoint_text(socket.remote_endpoint(remote_ec));
      if (!pending.make_room()) {
        asio::error_code ignored;
        socket.close(ignored);
      } else {
        start(std::move(socket), std::move(address), std::nullopt);
      }
      accept();
    });
  }

  // Out of descriptors (EMFILE), say: a silent connection gives one back; else accepting again
  // at once would fail the same way, so it waits a little.
  void accept_failed(const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open() || closing) return;
    pending.accept_failed(ec.message());
    if (pending.evict_silent()) return accept();
    accept_retry.expires_after(std::chrono::milliseconds(20));
    accept_retry.async_wait([this](const asio::error_code& e) {
      if (!e && !closing) accept();
    });
  }

  void tick() {
    if (closing) return;
    const auto now = Clock::now();
    if (const std::string line = pending.summary(now); !line.empty()) log(line);
    std::vector<ConnectionPtr> all(connections.begin(), connections.end());
    for (const auto& conn : all) {
      conn->has_progress();
      if (!conn->ready()) {
        if (now - conn->opened() > options.handshake_timeout) {
          conn->close("no handshake within " + std::to_string(options.handshake_timeout.count()) +
                      " ms");
        }
      } else if (now - conn->last_received() > options.peer_timeout) {
        conn->close("no bytes (frames or heartbeats) for " +
                    std::to_string(options.peer_timeout.count()) + " ms");
      } else if (!conn->writing() && now - conn->last_sent() >= options.heartbeat_interval) {
        conn->send(encode_frame_parts(Message(MessageKind::Heartbeat, 0)));
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

void TcpCommunicator::connect(int peer, const std::string& host, uint16_t port,
                              const std::function<bool()>& give_up) {
  const std::string where = host + ":" + std::to_string(port);
  set_listening_address(peer, where);
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
                              if (e) return result->set_value("retry:" + e.message());
                              if (impl_->closing)
                                return result->set_value("this endpoint is closing");
                              ConnectionPtr conn = impl_->start(std::move(*socket), where, peer);
                              if (conn->closed())
                                return result->set_value("retry:closed during start");
                              if (conn->ready()) return result->set_value("");
                              impl_->dial_results[conn] = result;
                            });
    });
    while (outcome.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (Clock::now() >= deadline) {
        throw Error("connect to " + where + ": no handshake within " +
                    std::to_string(impl_->options.connect_timeout.count()) + " ms");
      }
      if (give_up && give_up()) throw Error("connect to " + where + ": abandoned");
    }
    const std::string error = outcome.get();
    if (error.empty()) return;
    const bool retry = error.rfind("retry:", 0) == 0 ||
                       error.find("refused by the peer: busy") != std::string::npos;
    if (give_up && give_up()) throw Error("connect to " + where + ": abandoned (" + error + ")");
    if (retry && Clock::now() + std::chrono::milliseconds(100) < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    throw Error("connect to " + where +
                " failed: " + (error.rfind("retry:", 0) == 0 ? error.substr(6) : error));
  }
}

void TcpCommunicator::wait_for_peer(int peer, std::chrono::milliseconds timeout,
                                    const std::function<bool()>& give_up) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(impl_->peers_mutex);
  while (!impl_->peer_ready.wait_for(lock, std::chrono::milliseconds(100),
                                     [&] { return impl_->addresses.count(peer) > 0; })) {
    if (Clock::now() >= deadline) {
      throw Error("endpoint " + std::to_string(id()) + ": peer " + std::to_string(peer) +
                  " did not connect within " + std::to_string(timeout.count()) + " ms");
    }
    lock.unlock();
    const bool abandon = give_up && give_up();
    lock.lock();
    if (abandon) {
      throw Error("endpoint " + std::to_string(id()) + ": stopped waiting for peer " +
                  std::to_string(peer));
    }
  }
}

bool TcpCommunicator::is_connected(int peer) const {
  std::lock_guard<std::mutex> lock(impl_->peers_mutex);
  return impl_->addresses.count(peer) > 0;
}

void TcpCommunicator::set_listening_address(int peer, const std::string& address) {
  std::lock_guard<std::mutex> lock(impl_->peers_mutex);
  impl_->listening[peer] = address;
}

std::string TcpCommunicator::peer_address(int peer) const {
  std::lock_guard<std::mutex> lock(impl_->peers_mutex);
  auto it = impl_->addresses.find(peer);
  return it == impl_->addresses.end() ? "" : it->second;
}

void TcpCommunicator::send(int peer, Message message) {
  if (peer == id()) {
    message.from = peer;
    impl_->inbox.push(std::move(message));
    return;
  }
  if (impl_->closing) return;
  EncodedFrame encoded = encode_frame_parts(message);
  ConnectionPtr route;
  {
    std::lock_guard<std::mutex> lock(impl_->peers_mutex);
    auto it = impl_->routes.find(peer);
    if (it != impl_->routes.end()) route = it->second;
  }
  if (route) return route->send(std::move(encoded));
  // No connection yet as far as this thread can tell: the io thread knows for sure.
  auto frame = std::make_shared<EncodedFrame>(std::move(encoded));
  asio::post(impl_->io, [this, peer, frame] {
    ConnectionPtr conn = impl_->route(peer);
    if (conn) return conn->send(std::move(*frame));
    if (impl_->closing) return;
    impl_->log("send: no connection to peer " + std::to_string(peer));
    impl_->inbox.push(to_message(PeerLost{peer, "", "no connection to this peer"}));
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
    impl_->accept_retry.cancel();
    std::vector<ConnectionPtr> all(impl_->connections.begin(), impl_->connections.end());
    for (const auto& conn : all) conn->close_after_write();
  });
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (impl_->open_connections > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  impl_->work.reset();
  impl_->io.stop();
  impl_->thread.join();
  {
    std::lock_guard<std::mutex> lock(impl_->peers_mutex);
    impl_->routes.clear();
  }
  impl_->inbox.close();
}

}  // namespace pipit
