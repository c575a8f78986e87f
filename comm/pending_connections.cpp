#include "comm/pending_connections.h"

namespace pipit {

bool PendingConnections::make_room() {
  if (count_ < most_ || evict_silent()) return true;
  ++refused_;
  return false;
}

bool PendingConnections::evict_silent() {
  while (!silent_.empty()) {
    const ConnectionPtr oldest = silent_.begin()->second;
    silent_.erase(silent_.begin());
    if (oldest->closed() || oldest->frames_received() > 0) continue;
    evicting_ = true;
    oldest->close("closed to make room for a newer connection");
    evicting_ = false;
    ++evicted_;
    return true;
  }
  return false;
}

void PendingConnections::add(const ConnectionPtr& conn) {
  ++count_;
  silent_.emplace(conn->opened(), conn);
}

void PendingConnections::remove(const ConnectionPtr& conn) {
  --count_;
  silent_.erase({conn->opened(), conn});
}

void PendingConnections::accept_failed(const std::string& why) {
  ++failed_accepts_;
  accept_error_ = why;
}

std::string PendingConnections::summary(Clock::time_point now) {
  if (evicted_ + refused_ + failed_accepts_ == 0 || now - last_summary_ < std::chrono::seconds(1)) {
    return "";
  }
  std::string line = "connections in their handshake (at most " + std::to_string(most_) +
                     "): " + std::to_string(evicted_) +
                     " closed silent to make room for newer ones, " + std::to_string(refused_) +
                     " refused";
  if (failed_accepts_ > 0) {
    line += ", " + std::to_string(failed_accepts_) + " accepts failed (" + accept_error_ + ")";
  }
  evicted_ = refused_ = failed_accepts_ = 0;
  last_summary_ = now;
  return line + " since the last such line";
}

}  // namespace pipit
