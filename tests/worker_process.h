#pragma once
// WorkerProcess: a pipeline worker process started from the test executable itself
// (tests/main.cpp's --worker role), its log captured, killed when the object goes.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codec/atomic_file.h"

extern char** environ;

namespace pipit::testing {

namespace fs = std::filesystem;

// A worker process started from this test executable (see tests/main.cpp).
class WorkerProcess {
 public:
  // `netns`: run it in that network namespace (`ip netns exec`), listening on `host`.
  explicit WorkerProcess(const std::string& token = "", std::vector<std::string> extra = {},
                         const std::string& netns = "", const std::string& host = "127.0.0.1")
      : host_(host) {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("pipit_worker_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    const std::string port_file = (dir_ / "port").string(), log = (dir_ / "log").string();
    // Several workers share the machine's cores: one thread each keeps them from spinning
    // against each other.
    std::vector<std::string> args = {
        exe,       "--worker",  "--listen", host + ":0",         "--port-file",
        port_file, "--threads", "1",        "--peer-timeout-ms", "3000"};
    if (!netns.empty()) args.insert(args.begin(), {"ip", "netns", "exec", netns});
    if (!token.empty()) {
      const std::string token_file = (dir_ / "token").string();
      write_file_atomic(token_file, token);
      fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write);
      args.insert(args.end(), {"--token-file", token_file});
    }
    for (auto& arg : extra) args.push_back(std::move(arg));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // `ip netns exec` runs the worker in place of itself: pid_ is the worker's.
    REQUIRE(posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(port_file) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(fs::exists(port_file));
    port_ = static_cast<uint16_t>(std::stoi(read_file(port_file)));
  }
  ~WorkerProcess() {
    kill();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  // Whether the process is still running (it has not exited or crashed).
  bool alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  std::string log() const { return read_file((dir_ / "log").string()); }

 private:
  std::string host_;
  fs::path dir_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace pipit::testing
