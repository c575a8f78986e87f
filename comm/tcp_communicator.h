#pragma once
// TcpCommunicator: Messages over TCP with standalone Asio. One io_context thread per
// communicator does all socket work; send() encodes on the caller's thread and queues the
// frame on the peer's connection, written in order with gathering writes (tensor bytes go
// from where they lie). Every connection opens with a handshake (protocol version, endpoint
// ids and, with a token, a mutual HMAC-SHA-256 challenge-response: the token never crosses
// the wire). Idle connections exchange heartbeats; a connection that fails, sends a bad
// frame or stays silent past peer_timeout is closed with a logged reason, and a PeerLost
// message naming the peer and its address lands in the inbox.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/frame.h"

namespace pipit {

struct TcpOptions {
  std::string token;  // empty: no authentication
  FrameLimits limits;
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds peer_timeout{5000};
  std::chrono::milliseconds connect_timeout{10000};  // connect() retries refused connects
  std::function<void(const std::string&)> log;       // one line per event; default: stderr
  // Sent in every Hello: which run this endpoint belongs to (see admit).
  std::string session;
  // Decides on each authenticated incoming connection by the id and session its peer
  // announces: empty admits it, any other text refuses it with that reason. A refusal
  // starting with "busy" makes the connecting side's connect() retry until its timeout.
  // Runs on the io thread.
  std::function<std::string(int peer, const std::string& session)> admit;
};

// The token in `path`, without a trailing newline; an unreadable file or an empty token is
// an Error naming the file.
std::string read_token_file(const std::string& path);

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
  // the address on refusal, authentication failure or timeout.
  void connect(int peer, const std::string& host, uint16_t port);
  // The address of a connected peer, "host:port"; empty when unknown.
  std::string peer_address(int peer) const;

  void send(int peer, Message message) override;
  Message receive() override;
  std::optional<Message> try_receive(std::chrono::milliseconds timeout) override;
  // Closes every connection and the listener, and wakes receive().
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipit
