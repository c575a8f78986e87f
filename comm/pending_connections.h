#pragma once
// The connections a TcpCommunicator accepted that are still in their handshake: at most
// `most` at once, and who makes room for whom past that. A renewed flood of connections that
// never finish a frame must not keep a real peer out, so a newcomer takes the place of the
// oldest one that has not sent a whole frame (a real peer sends its Hello as it connects);
// when every one has, the newcomer is refused and each of the others finishes or meets its
// handshake deadline. What happened is summed up in one line a second, however hard a flood
// comes. io thread only.
#include <chrono>
#include <cstddef>
#include <set>
#include <string>
#include <utility>

#include "comm/tcp_connection.h"

namespace pipit {

class PendingConnections {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PendingConnections(size_t most) : most_(most) {}

  // Whether a newcomer may start its handshake: there is room, or the oldest silent
  // connection was closed to make it. Counted as refused otherwise.
  bool make_room();
  // Frees a descriptor when accepting failed for want of one; false when none was silent.
  bool evict_silent();
  void add(const ConnectionPtr& conn);
  // Its handshake finished, or it closed.
  void remove(const ConnectionPtr& conn);
  // Whether the connection closing now is one evict_silent closed (its close is not news).
  bool evicting() const { return evicting_; }
  void accept_failed(const std::string& why);
  // What happened since the last summary, or "" when nothing did or the last came less than
  // a second ago.
  std::string summary(Clock::time_point now);

 private:
  size_t most_;
  size_t count_ = 0;
  // Those that may not have sent a whole frame yet, oldest first: one that has is dropped
  // from it when a newcomer needs room.
  std::set<std::pair<Clock::time_point, ConnectionPtr>> silent_;
  bool evicting_ = false;
  size_t evicted_ = 0, refused_ = 0, failed_accepts_ = 0;
  std::string accept_error_;
  Clock::time_point last_summary_;
};

}  // namespace pipit
