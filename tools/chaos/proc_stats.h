#pragma once
// What /proc says about a process: its resident memory and its open descriptors.
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/types.h>

namespace pipit::chaos {

struct ProcStats {
  long rss_kib = -1;  // VmRSS; -1 when the process is gone
  long fds = -1;      // entries of /proc/PID/fd
};

inline ProcStats proc_stats(pid_t pid) {
  ProcStats stats;
  const std::string base = "/proc/" + std::to_string(pid);
  std::ifstream status(base + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) stats.rss_kib = std::stol(line.substr(6));
  }
  std::error_code ec;
  long count = 0;
  for (std::filesystem::directory_iterator it(base + "/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++count;
  }
  if (!ec) stats.fds = count;
  return stats;
}

}  // namespace pipit::chaos
