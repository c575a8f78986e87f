#pragma once
// WorkerWatch: how the workers take the loss of their coordinator. Made at the moment of a
// fault, it notes which workers are serving a run and where their logs end; wait() then
// waits until each of them has logged the end of that run, and collects what they said.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/chaos/cluster.h"

namespace pipit::chaos {

class WorkerWatch {
 public:
  struct Result {
    bool any_serving = false;
    bool all_released = true;  // every serving worker ended its run
    bool all_named = true;     // and its log names the coordinator (peer -1)
    Clock::time_point last_release{};
    std::string words;    // the first worker's lines about it
    std::string missing;  // who did not end the run, with its log
  };

  explicit WorkerWatch(Cluster& cluster) : cluster_(cluster) {
    for (int i = 0; i < cluster.size(); ++i) {
      const std::string text = read_all(cluster.worker_log(i));
      offsets_.push_back(text.size());
      serving_.push_back(last_worker_line(text).find(" ready (") != std::string::npos);
    }
  }

  Result wait(Clock::time_point deadline) {
    Result result;
    std::vector<bool> released(serving_.size(), false);
    for (size_t i = 0; i < serving_.size(); ++i) {
      if (!serving_[i]) continue;
      result.any_serving = true;
      const int w = static_cast<int>(i);
      std::string fresh;
      while (true) {
        fresh = read_all(cluster_.worker_log(w)).substr(offsets_[i]);
        if (ended_run(fresh) || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (!ended_run(fresh)) {
        result.all_released = false;
        result.missing += "worker " + std::to_string(i) + " did not end its run; its log:\n" +
                          read_tail(cluster_.worker_log(w), 1500);
        continue;
      }
      result.last_release = std::max(result.last_release, Clock::now());
      const bool named = fresh.find("peer -1") != std::string::npos ||
                         fresh.find("coordinator") != std::string::npos;
      result.all_named = result.all_named && named;
      if (result.words.empty()) {
        result.words = "worker " + std::to_string(i) + ": " + line_naming_coordinator(fresh);
      }
    }
    return result;
  }

  // Whether worker i waits for a coordinator and none has claimed it since (a claimed worker
  // refuses others as busy until its run ends).
  static bool unclaimed(Cluster& cluster, int i) {
    const std::string text = read_all(cluster.worker_log(i));
    const size_t waiting = text.rfind("[worker] waiting for a coordinator");
    return waiting != std::string::npos &&
           text.find("connected to peer -1", waiting) == std::string::npos;
  }

 private:
  static std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static std::string last_worker_line(const std::string& text) {
    const size_t at = text.rfind("[worker]");
    if (at == std::string::npos) return "";
    return text.substr(at, text.find('\n', at) - at);
  }
  static bool ended_run(const std::string& text) {
    return text.find("[worker] run finished") != std::string::npos ||
           text.find("before the run started") != std::string::npos ||
           text.find("sent no stage package") != std::string::npos;
  }
  // The line that names the coordinator (peer -1), else the first line.
  static std::string line_naming_coordinator(const std::string& text) {
    size_t at = text.find("peer -1");
    at = at == std::string::npos ? 0 : text.rfind('\n', at);
    at = at == std::string::npos ? 0 : at + 1;
    return text.substr(at, text.find('\n', at) - at);
  }

  Cluster& cluster_;
  std::vector<size_t> offsets_;
  std::vector<bool> serving_;
};

}  // namespace pipit::chaos
