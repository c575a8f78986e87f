#pragma once
// Appending a benchmark's results to bench/RESULTS.md under a heading that names the
// benchmark, the date (UTC), the CPU and its cores.
#include <ctime>
#include <fstream>
#include <string>
#include <thread>

namespace pipit::bench {

inline std::string cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// "\n## <benchmark>, 2026-11-23, <CPU>, <n> cores\n\n" then `text`.
inline void append_results(const std::string& benchmark, const std::string& text) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::ofstream results(std::string(PIPIT_SOURCE_DIR) + "/bench/RESULTS.md", std::ios::app);
  results << "\n## " << benchmark << ", " << date << ", " << cpu_name() << ", "
          << std::thread::hardware_concurrency() << " cores\n\n"
          << text;
}

}  // namespace pipit::bench
