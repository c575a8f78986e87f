#pragma once
// The TCP flags every program that runs a pipeline over the network shares, once: the
// coordinator's side (train_gpt, the chaos trainer) and a worker's (pipit-worker, the chaos
// worker), and the TcpOptions they make.
#include <chrono>

#include "comm/tcp_communicator.h"
#include "support/flags.h"

namespace pipit::support {

enum class TcpSide { coordinator, worker };

// --token-file, --heartbeat-ms, --peer-timeout-ms, --connect-timeout-ms; a worker also takes
// --handshake-timeout-ms, --max-frame-mb and --max-pending, which bound what unproven peers
// may cost it.
inline void add_tcp_flags(Flags& flags, TcpSide side) {
  const bool worker = side == TcpSide::worker;
  flags.add("token-file", "",
            worker ? "file holding the shared token peers must prove (default: none)"
                   : "file holding the token the workers expect (default: none)");
  flags.add("heartbeat-ms", "500", "heartbeat interval on idle connections");
  flags.add("peer-timeout-ms", "5000", "a peer silent this long is reported lost");
  flags.add("connect-timeout-ms", "10000",
            worker ? "how long to wait for a neighbouring stage to connect, or to connect to it"
                   : "how long to retry connecting to a busy worker");
  if (!worker) return;
  flags.add("handshake-timeout-ms", "10000", "a connection must prove the token within this");
  flags.add("max-frame-mb", "2048", "largest frame body accepted, in MiB");
  flags.add("max-pending", "64", "connections allowed in their handshake at once");
}

inline pipit::TcpOptions tcp_options(const Flags& flags, TcpSide side) {
  using std::chrono::milliseconds;
  pipit::TcpOptions tcp;
  if (!flags.str("token-file").empty()) tcp.token = pipit::read_token_file(flags.str("token-file"));
  tcp.heartbeat_interval = milliseconds(flags.integer("heartbeat-ms", 1));
  tcp.peer_timeout = milliseconds(flags.integer("peer-timeout-ms", 1));
  tcp.connect_timeout = milliseconds(flags.integer("connect-timeout-ms", 0));
  if (side == TcpSide::worker) {
    tcp.handshake_timeout = milliseconds(flags.integer("handshake-timeout-ms", 1));
    tcp.limits.max_body_bytes = static_cast<size_t>(flags.integer("max-frame-mb")) << 20;
    tcp.max_pending_connections = static_cast<size_t>(flags.integer("max-pending", 1));
  }
  return tcp;
}

}  // namespace pipit::support
