#pragma once
// The checkpoint directory of a chaos session: a small tmpfs mounted for the session when
// the system allows it (so that the driver can fill it up), else a plain directory and the
// disk-full fault is skipped. Also what the driver checks there: the latest checkpoint loads,
// which temporaries a killed writer left behind, and whether two checkpoints are equal bit
// for bit.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include "serialize/checkpoint.h"
#include "tensor/tensor.h"

namespace pipit::chaos {

namespace fs = std::filesystem;

class CheckpointDir {
 public:
  static constexpr const char* kFile = "checkpoint.safetensors";
  static constexpr const char* kFiller = "filler";

  // Mounts a tmpfs of `tmpfs_bytes` at `path` (0: do not try).
  CheckpointDir(const std::string& path, size_t tmpfs_bytes) : path_(path) {
    fs::create_directories(path_);
    if (tmpfs_bytes == 0) {
      why_not_ = "no tmpfs was asked for";
      return;
    }
    const std::string options = "size=" + std::to_string(tmpfs_bytes) + ",mode=0755";
    if (mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_not_ = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
    }
  }
  ~CheckpointDir() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file() const { return path_ + "/" + kFile; }
  bool can_fill() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }

  // Writes zeros until the file system is full; returns the bytes written.
  size_t fill() {
    const int fd =
        open((path_ + "/" + kFiller).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    PIPIT_CHECK(fd >= 0, "chaos: cannot create the filler: ", std::strerror(errno));
    static const std::string zeros(1 << 16, '\0');
    size_t total = 0;
    for (size_t chunk = zeros.size(); chunk > 0;) {
      const ssize_t n = write(fd, zeros.data(), chunk);
      if (n > 0) {
        total += static_cast<size_t>(n);
      } else {
        chunk /= 2;  // ENOSPC: fill the last pages with smaller writes
      }
    }
    close(fd);
    return total;
  }
  void unfill() {
    std::error_code ignored;
    fs::remove(path_ + "/" + kFiller, ignored);
  }

  // Files other than the checkpoint and the filler: temporaries of interrupted writes.
  std::vector<std::string> temporaries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) {
      const std::string name = entry.path().filename().string();
      if (name != kFile && name != kFiller) names.push_back(name);
    }
    return names;
  }
  void remove_temporaries() const {
    for (const std::string& name : temporaries()) fs::remove(path_ + "/" + name);
  }

  bool exists() const { return fs::exists(file()); }
  // The latest checkpoint; throws (naming the file) when it does not load.
  Checkpoint latest() const { return load_checkpoint(file()); }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string why_not_;
};

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

inline std::string compare_groups(const StateDict& a, const StateDict& b, const std::string& what) {
  if (a.size() != b.size())
    return what + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " tensors";
  for (const auto& [name, tensor] : a) {
    auto other = b.find(name);
    if (other == b.end()) return what + ": '" + name + "' is missing";
    if (!same_bits(tensor, other->second)) return what + ": '" + name + "' differs";
  }
  return "";
}

// "" when the two checkpoints hold the same step, data position, weights and optimizer state
// bit for bit; else the first difference.
inline std::string compare_checkpoints(const Checkpoint& a, const Checkpoint& b) {
  if (a.step != b.step) {
    return "step " + std::to_string(a.step) + " vs " + std::to_string(b.step);
  }
  if (a.rng_seed != b.rng_seed || a.rng_offset != b.rng_offset) return "data RNG state differs";
  std::string diff = compare_groups(a.weights, b.weights, "weights");
  if (diff.empty()) diff = compare_groups(a.optimizer_state, b.optimizer_state, "optimizer");
  return diff;
}

}  // namespace pipit::chaos
