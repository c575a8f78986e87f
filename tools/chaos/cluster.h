#pragma once
// Cluster: the processes of one distributed training session on 127.0.0.1: N workers, each
// behind a FaultProxy whose address is the one the coordinator (the "trainer") is told, and at
// most one trainer at a time. Everything it starts is a ChildProcess, killed when the Cluster goes.
// Logs: DIR/worker<i>.<n>.log (the n-th start of worker i), DIR/<tag>.out and .err.
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/atomic_file.h"
#include "support/child_process.h"
#include "tools/chaos/log_tail.h"
#include "tools/chaos/proxy.h"

namespace pipit::chaos {

using support::ChildProcess;

// How to start a worker and a trainer: an argv prefix, to which the flags are appended.
struct Programs {
  std::vector<std::string> worker, trainer;

  // pipit-worker and train_gpt in `bin_dir`.
  static Programs tools(const std::string& bin_dir) {
    return {{bin_dir + "/pipit-worker"}, {bin_dir + "/train_gpt"}};
  }
  // `self` in its --chaos-role roles (tools/chaos/roles.h).
  static Programs roles(const std::string& self) {
    return {{self, "--chaos-role", "worker"}, {self, "--chaos-role", "trainer"}};
  }
};

struct ClusterOptions {
  Programs programs;
  std::string dir;  // work directory: logs, token, port files
  int workers = 3;
  bool proxies = true;  // false: the trainer connects to the workers directly
  std::chrono::milliseconds peer_timeout{1500}, heartbeat{250}, step_timeout{6000};
  std::chrono::milliseconds connect_timeout{8000}, package_timeout{5000};
  std::vector<std::string> trainer_args;  // steps, model and checkpoint-every flags
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {
    std::filesystem::create_directories(options_.dir);
    std::random_device random;
    std::string token;
    for (int i = 0; i < 4; ++i) token += std::to_string(random());
    token_file_ = options_.dir + "/token";
    write_file_atomic(token_file_, token + "\n");
    std::filesystem::permissions(
        token_file_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    workers_.resize(static_cast<size_t>(options_.workers));
    starts_.resize(workers_.size(), 0);
    logs_.resize(workers_.size());
    ports_.resize(workers_.size(), 0);
    for (int i = 0; i < options_.workers; ++i) start_worker(i);
  }
  ~Cluster() {
    trainer_.reset();
    workers_.clear();
    proxies_.clear();
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int size() const { return options_.workers; }
  const ClusterOptions& options() const { return options_; }
  ChildProcess& worker(int i) { return *workers_.at(static_cast<size_t>(i)); }
  FaultProxy* proxy(int i) {
    return proxies_.empty() ? nullptr : proxies_.at(static_cast<size_t>(i)).get();
  }
  // The address the trainer and the neighbouring stages use for worker i.
  std::string endpoint(int i) const {
    return proxies_.empty() ? "127.0.0.1:" + std::to_string(ports_[static_cast<size_t>(i)])
                            : proxies_[static_cast<size_t>(i)]->address();
  }
  const std::string& worker_log(int i) const { return logs_.at(static_cast<size_t>(i)); }

  // (Re)starts worker i on a fresh port and points its proxy there.
  void start_worker(int i) {
    const auto index = static_cast<size_t>(i);
    workers_[index].reset();
    const std::string base =
        options_.dir + "/worker" + std::to_string(i) + "." + std::to_string(starts_[index]++);
    const std::string port_file = base + ".port";
    std::filesystem::remove(port_file);  // left by an earlier session in the same directory
    logs_[index] = base + ".log";
    std::vector<std::string> argv = options_.programs.worker;
    for (const std::string& arg :
         {std::string("--listen"), std::string("127.0.0.1:0"), std::string("--port-file"),
          port_file, std::string("--token-file"), token_file_, std::string("--threads"),
          std::string("1"), std::string("--peer-timeout-ms"), ms(options_.peer_timeout),
          std::string("--heartbeat-ms"), ms(options_.heartbeat),
          std::string("--package-timeout-ms"), ms(options_.package_timeout),
          std::string("--connect-timeout-ms"), ms(options_.connect_timeout)}) {
      argv.push_back(arg);
    }
    workers_[index] = std::make_unique<ChildProcess>(argv, logs_[index], logs_[index]);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(port_file)) {
      PIPIT_CHECK(workers_[index]->running() && Clock::now() < deadline, "chaos: worker ", i,
                  " did not start:\n", read_tail(logs_[index]));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ports_[index] = static_cast<uint16_t>(std::stoi(read_file(port_file)));
    if (!options_.proxies) return;
    if (proxies_.size() < workers_.size()) {
      proxies_.push_back(std::make_unique<FaultProxy>(ports_[index]));
    } else {
      proxies_[index]->set_target(ports_[index]);
    }
  }

  // Starts a trainer against the workers, writing checkpoints to `checkpoint_dir`; its output
  // goes to DIR/<tag>.out and .err.
  void start_trainer(const std::string& checkpoint_dir, bool resume, const std::string& tag) {
    trainer_.reset();
    std::string workers;
    for (int i = 0; i < size(); ++i) workers += (i ? "," : "") + endpoint(i);
    std::vector<std::string> argv = options_.programs.trainer;
    for (const std::string& arg : {std::string("--workers"),
                                   workers,
                                   std::string("--token-file"),
                                   token_file_,
                                   std::string("--checkpoint-dir"),
                                   checkpoint_dir,
                                   std::string("--print-every"),
                                   std::string("1"),
                                   std::string("--sample"),
                                   std::string("0"),
                                   std::string("--threads"),
                                   std::string("1"),
                                   std::string("--peer-timeout-ms"),
                                   ms(options_.peer_timeout),
                                   std::string("--heartbeat-ms"),
                                   ms(options_.heartbeat),
                                   std::string("--step-timeout-ms"),
                                   ms(options_.step_timeout),
                                   std::string("--connect-timeout-ms"),
                                   ms(options_.connect_timeout)}) {
      argv.push_back(arg);
    }
    for (const std::string& arg : options_.trainer_args) argv.push_back(arg);
    if (resume) argv.push_back("--resume");
    trainer_out_ = options_.dir + "/" + tag + ".out";
    trainer_err_ = options_.dir + "/" + tag + ".err";
    trainer_ = std::make_unique<ChildProcess>(argv, trainer_out_, trainer_err_);
    trainer_started_ = Clock::now();
    progress_.emplace(trainer_out_);
    step_ = -1;
  }
  ChildProcess* trainer() { return trainer_.get(); }
  Clock::time_point trainer_started() const { return trainer_started_; }
  // The last "step N" the trainer printed (-1: none yet); reads what it wrote since.
  int64_t step() {
    if (!progress_) return step_;
    for (const std::string& line : progress_->new_lines()) {
      if (line.rfind("step ", 0) == 0) step_ = std::stoll(line.substr(5));
    }
    return step_;
  }
  // The trainer's last line on stderr (its error), or "".
  std::string trainer_error() const {
    std::string text = read_tail(trainer_err_);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    const size_t newline = text.rfind('\n');
    return newline == std::string::npos ? text : text.substr(newline + 1);
  }
  std::string trainer_stderr() const { return read_tail(trainer_err_); }

 private:
  static std::string ms(std::chrono::milliseconds value) { return std::to_string(value.count()); }

  ClusterOptions options_;
  std::string token_file_;
  std::vector<std::unique_ptr<FaultProxy>> proxies_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::vector<int> starts_;
  std::vector<std::string> logs_;
  std::vector<uint16_t> ports_;
  std::unique_ptr<ChildProcess> trainer_;
  Clock::time_point trainer_started_{};
  std::string trainer_out_, trainer_err_;
  std::optional<LogTail> progress_;
  int64_t step_ = -1;
};

}  // namespace pipit::chaos
