#include "serialize/model_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "codec/durable_fs.h"
#include "codec/json_depth.h"
#include "codec/safetensors.h"
#include "nn/registry.h"

namespace pipit {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = "config.json";
constexpr const char* kWeights = "model.safetensors";
// A load that finds the directory swapped under it starts over, at most this often.
constexpr int kLoadAttempts = 4;

// What a model directory may hold: its two files, and the temporaries that a killed writer
// of either (earlier versions replaced each file in place) could leave.
bool is_model_entry(const std::string& name) {
  return name == kConfig || name == kWeights || name.starts_with(".config.json.tmp.") ||
         name.starts_with(".model.safetensors.tmp.");
}

// Deletes a model directory this save made or replaced, best effort: only model entries go,
// so a file someone else put there meanwhile keeps the directory (and itself) alive.
void remove_model_dir(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_model_entry(entry.path().filename().string())) ::unlink(entry.path().c_str());
  }
  ::rmdir(dir.c_str());
}

// The directory a save replaces: symlinks resolved (the link stays, its target is replaced),
// no trailing separator, so that the sibling staging directory lies beside the real one.
fs::path resolve_target(const std::string& dir) {
  fs::path target = fs::weakly_canonical(fs::absolute(dir));
  if (!target.has_filename()) target = target.parent_path();
  return target;
}

// A directory about to be replaced must hold nothing but a model: the save deletes what the
// previous one held.
void check_replaceable(const fs::path& target) {
  PIPIT_CHECK(fs::is_directory(target), "'", target.string(), "' exists and is not a directory");
  for (const auto& entry : fs::directory_iterator(target)) {
    const std::string name = entry.path().filename().string();
    PIPIT_CHECK(is_model_entry(name), "'", target.string(), "' holds '", name,
                "', which is not part of a saved model; a save replaces the whole directory, so "
                "save into a new directory or one that holds only a model");
  }
}

// Puts `staging` where `target` is; returns where the previous model now lies ("" where
// there was none), for the caller to delete.
std::string swap_into_place(const std::string& staging, const std::string& target, bool existed) {
  if (!existed) {
    rename_path(staging, target);
    return "";
  }
  if (exchange_paths(staging, target)) return staging;
  // No RENAME_EXCHANGE here (an old kernel, some network file systems): two renames, between
  // which a crash leaves no `target` but the previous model whole under `aside`.
  const std::string aside = create_temp_dir(target);
  try {
    rename_path(target, aside);  // replaces the empty `aside`
  } catch (const Error&) {
    ::rmdir(aside.c_str());
    throw;
  }
  try {
    rename_path(staging, target);
  } catch (const Error& e) {
    if (::rename(aside.c_str(), target.c_str()) != 0) {
      throw Error(std::string(e.what()) + "; the previous model is kept in '" + aside + "'");
    }
    throw;
  }
  return aside;
}

void replace_model_dir(const fs::path& target, const std::string& config,
                       const std::string& weights) {
  const bool existed = fs::exists(target);
  if (existed) {
    check_replaceable(target);
  } else {
    fs::create_directories(target.parent_path());
  }
  const std::string staging = create_temp_dir(target.string());
  std::string previous;
  try {
    // The replacement keeps the mode someone may have given the directory (0700, say).
    if (existed) fs::permissions(staging, fs::status(target).permissions());
    finish_file(create_new_file(staging + "/" + kConfig), config);
    finish_file(create_new_file(staging + "/" + kWeights), weights);
    fsync_directory(staging);
    previous = swap_into_place(staging, target.string(), existed);
  } catch (...) {
    remove_model_dir(staging);
    throw;
  }
  // From here the new model is in place; whatever happens, the previous one goes.
  try {
    fsync_directory(target.parent_path().string());
  } catch (const Error& e) {
    if (!previous.empty()) remove_model_dir(previous);
    // Named first: GCC 12 misreports "'" + target.string() at -O3 (-Wrestrict).
    const std::string path = target.string();
    throw Error("'" + path + "' was replaced but may not survive a crash: " + e.what());
  }
  if (!previous.empty()) remove_model_dir(previous);
}

// The errno of a failed read, or 0; the file's bytes in *out.
int read_at(int dir_fd, const char* name, std::string* out) {
  const int fd = ::openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st {};
  if (::fstat(fd, &st) == 0) out->reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return err;
    }
    if (n == 0) break;
    out->append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return 0;
}

bool same_inode(int dir_fd, const std::string& dir) {
  struct stat opened {
  }, now{};
  return ::fstat(dir_fd, &opened) == 0 && ::stat(dir.c_str(), &now) == 0 &&
         opened.st_dev == now.st_dev && opened.st_ino == now.st_ino;
}

// Both files, read through one descriptor of the directory: a save swapping the directory
// meanwhile cannot pair one model's config with another's weights. A save that deleted the
// files of the directory opened sends the load round again.
std::pair<std::string, std::string> read_model_files(const std::string& dir) {
  for (int attempt = 1;; ++attempt) {
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw Error("load_model: cannot open '" + dir + "': " + std::strerror(errno));
    std::pair<std::string, std::string> files;
    const char* failed = kConfig;
    int err = read_at(dir_fd, kConfig, &files.first);
    if (!err) {
      failed = kWeights;
      err = read_at(dir_fd, kWeights, &files.second);
    }
    const bool replaced = err == ENOENT && !same_inode(dir_fd, dir);
    ::close(dir_fd);
    if (!err) return files;
    if (!replaced || attempt == kLoadAttempts) {
      throw Error("load_model: cannot read '" + dir + "/" + failed + "': " + std::strerror(err));
    }
  }
}

}  // namespace

void save_model(const Module& model, const std::string& dir) {
  // Both encoded before anything touches the disk.
  const std::string config = model.config().dump(2) + "\n";
  const std::string weights = encode_safetensors(model.state_dict());
  try {
    replace_model_dir(resolve_target(dir), config, weights);
  } catch (const Error& e) {
    throw Error("save_model '" + dir + "': " + e.what());
  } catch (const fs::filesystem_error& e) {
    throw Error("save_model '" + dir + "': " + e.what());
  }
}

std::shared_ptr<Module> load_model(const std::string& dir) {
  const auto [config_text, weights_bytes] = read_model_files(dir);
  const std::string config_path = dir + "/" + kConfig;
  check_json_nesting(config_text, "load_model: '" + config_path + "' ");
  json config;
  try {
    config = json::parse(config_text);
  } catch (const json::exception& e) {
    throw Error("load_model: '" + config_path + "' is not valid JSON: " + e.what());
  }
  std::shared_ptr<Module> model;
  try {
    model = build_module(config);
  } catch (const Error& e) {
    throw Error("load_model: '" + config_path + "': " + e.what());
  }
  const std::string weights_path = dir + "/" + kWeights;
  try {
    model->load_state_dict(
        decode_safetensors(weights_bytes.data(), weights_bytes.size(), weights_path));
  } catch (const Error& e) {
    throw Error("load_model: '" + weights_path + "': " + e.what());
  }
  return model;
}

}  // namespace pipit
