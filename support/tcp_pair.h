#pragma once
// Two TcpCommunicators on loopback, connected, both handshakes through: where a benchmark or a
// test of the transport itself starts.
#include <chrono>
#include <memory>
#include <string>

#include "comm/tcp_communicator.h"

namespace pipit::support {

struct TcpPair {
  std::shared_ptr<TcpCommunicator> a, b;  // ranks 0 and 1
};

// a connects to b; returns once b has a's handshake too, so either may send first.
inline TcpPair connected_tcp_pair() {
  TcpOptions options;
  options.log = [](const std::string&) {};
  TcpPair pair{std::make_shared<TcpCommunicator>(0, options),
               std::make_shared<TcpCommunicator>(1, options)};
  const uint16_t port = pair.b->listen("127.0.0.1", 0);
  pair.a->connect(1, "127.0.0.1", port);
  pair.b->wait_for_peer(0, std::chrono::seconds(5));
  return pair;
}

}  // namespace pipit::support
