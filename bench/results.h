#pragma once
// What the benchmarks share around their measurements: medians, running a peer or a helper
// command and reading what it printed, and appending results to bench/RESULTS.md under a
// heading that names the benchmark, the date (UTC), the CPU and its cores, unless --no-append.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/flags.h"

namespace pipit::bench {

// Seconds from `start` to now, on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The middle value (the upper of the two middle ones for an even count; 0 for none).
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

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

// PyTorch 2.x from the benchmarks' venv (PIPIT_BENCH_VENVS, default ~/.cache/pipit-bench, as
// bench/cpu_vs_torch.py makes it) when it is there, else Debian's python3 and its torch.
inline std::string peer_python() {
  const char* venvs = std::getenv("PIPIT_BENCH_VENVS");
  const char* home = std::getenv("HOME");
  const std::string root =
      venvs ? std::string(venvs) : std::string(home ? home : "/root") + "/.cache/pipit-bench";
  const std::string venv = root + "/torch2/bin/python";
  return std::filesystem::exists(venv) ? venv : "/usr/bin/python3";
}

inline void add_no_append_flag(support::Flags& flags) {
  flags.add_switch("no-append", "print only; do not append to bench/RESULTS.md");
}

// What a shell command printed on its standard output, line by line (each with its newline),
// and whether it exited with status 0.
struct CommandOutput {
  std::vector<std::string> lines;
  bool ok = false;
};

inline CommandOutput command_output(const std::string& command) {
  CommandOutput out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe)) out.lines.push_back(line);
  out.ok = pclose(pipe) == 0;
  return out;
}

// Runs a peer (a Python script) and returns the JSON objects it printed, one per line; other
// lines (progress bars, warnings) are ignored. A failed command is reported under `who`.
inline std::vector<nlohmann::json> peer_json_lines(const std::string& command, const char* who) {
  const CommandOutput out = command_output(command);
  std::vector<nlohmann::json> rows;
  for (const std::string& line : out.lines) {
    if (line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  }
  if (!out.ok) std::fprintf(stderr, "%s: '%s' failed\n", who, command.c_str());
  return rows;
}

}  // namespace pipit::bench
