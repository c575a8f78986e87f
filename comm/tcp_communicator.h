#pragma once
// TcpCommunicator: Messages over TCP with standalone Asio. One io_context thread per
// communicator accepts, reads, keeps time and finishes writes; send() encodes on the
// caller's thread and, when nothing is queued on the peer's connection, writes the frame
// itself as far as the socket takes it without blocking (a small message costs no hand-off
// to the io thread), the rest queued for the io thread in order. Writes are gathering (tensor
// bytes go from where they lie). Every connection opens with a handshake (protocol version,
// endpoint ids and, with a token, a mutual HMAC-SHA-256 challenge-response: the token never crosses
// the wire). Idle connections exchange heartbeats; a connection that fails, sends a bad
// frame or sends no byte for peer_timeout is closed with a logged reason, and a PeerLost
// message naming the peer and its address lands in the inbox. Nothing a peer sends can
// stop the io thread: a handler that throws closes only its connection.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/frame.h"

namespace pipit {

struct TcpOptions {
  std::string token;   // empty: no authentication
  FrameLimits limits;  // for authenticated peers; before that, kHandshakeLimits
  std::chrono::milliseconds heartbeat_interval{500};
  // A connected peer from which no byte arrives for this long is reported lost.
  std::chrono::milliseconds peer_timeout{5000};
  // A connection whose handshake has not completed within this long is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds connect_timeout{10000};  // connect() retries refused connects
  // Incoming connections in their handshake at once. Past it, a newcomer takes the place of
  // the oldest one that has not sent a whole frame (a real peer sends its Hello at once, a
  // flood of idle connections never does); when every one has, the newcomer is closed.
  size_t max_pending_connections = 64;
  std::function<void(const std::string&)> log;  // one line per event; default: stderr
  // Sent in every Hello: which run this endpoint belongs to (see admit).
  std::string session;
  // Decides on each authenticated incoming connection by the id and session its peer
  // announces: empty admits it, any other text refuses it with that reason. A refusal
  // starting with "busy" makes the connecting side's connect() retry until its timeout.
  // Runs on the io thread.
  std::function<std::string(int peer, const std::string& session)> admit;
};

// The token in `path`, without a trailing newline; an unreadable file or an empty token is
// an Error naming the file. A file that others than its owner may read is logged as a warning.
std::string read_token_file(const std::string& path,
                            const std::function<void(const std::string&)>& warn = {});

// "host:port" -> (host, port); throws an Error naming the text when malformed.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& text);

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(int id, TcpOptions options);
  ~TcpCommunicator() override;

  int id() const override;
  // Changes this endpoint's id (a worker learns its stage index from the coordinator).
  // Only before connect().
  void set_id(int id);
  // Changes the session sent in later Hellos. Only before connect().
  void set_session(const std::string& session);
  // Accepts connections on host:port (port 0: any free port); returns the bound port.
  uint16_t listen(const std::string& host, uint16_t port);
  // Connects to the endpoint at host:port, which must identify itself as `peer`, and
  // completes the handshake; sends to `peer` then use this connection. Throws an Error naming
  // the address on refusal, authentication failure or timeout, or as soon as `give_up`
  // (polled every 100 ms) returns true.
  void connect(int peer, const std::string& host, uint16_t port,
               const std::function<bool()>& give_up = {});
  // Waits until `peer` has connected to this endpoint (or this one to it); throws an Error
  // naming the peer after `timeout`, or once `give_up` returns true.
  void wait_for_peer(int peer, std::chrono::milliseconds timeout,
                     const std::function<bool()>& give_up = {});
  // Whether a connection to `peer` has completed its handshake and is open.
  bool is_connected(int peer) const;
  // Records the address `peer` listens on, so errors about a connection it opened to this
  // endpoint name that address rather than the connection's ephemeral port.
  void set_listening_address(int peer, const std::string& address);
  // The address of a connected peer, "host:port"; empty when unknown.
  std::string peer_address(int peer) const;

  void send(int peer, Message message) override;
  Message receive() override;
  std::optional<Message> try_receive(std::chrono::milliseconds timeout) override;
  // Closes every connection and the listener, and wakes receive(). Frames sent before it
  // are written first (for up to 2 s); frames sent once it has begun are dropped.
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipit
