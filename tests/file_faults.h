#pragma once
// Helpers for tests of durable writes: a scratch directory removed on every exit (failed
// REQUIREs included), a file-step fault injected for one scope (set_file_fault_hook), and a
// directory's entries.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "codec/durable_fs.h"

namespace pipit::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("pipit_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

// Fails `step` with `err` on paths containing `fragment`, while it exists.
struct InjectFault {
  InjectFault(FileStep step, std::string fragment, int err = EIO) {
    set_file_fault_hook([=](FileStep s, const std::string& path) {
      return s == step && path.find(fragment) != std::string::npos ? err : 0;
    });
  }
  ~InjectFault() { set_file_fault_hook(nullptr); }
};

inline std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

inline const std::string kEio = std::strerror(EIO);

}  // namespace pipit::testing
