#include "codec/durable_fs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tensor/error.h"

namespace pipit {
namespace {

thread_local FileFaultHook fault_hook;

// Names are unique within the process by the counter; the pid sets processes apart, and a
// crashed process's leftover that happens to share pid and count is skipped (EEXIST).
std::atomic<uint64_t> temp_counter{0};
constexpr int kCreateAttempts = 100;

// The errno the test hook wants `step` on `path` to fail with, or 0.
int injected(FileStep step, const std::string& path) {
  return fault_hook ? fault_hook(step, path) : 0;
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw Error(what + " '" + path + "': " + std::strerror(err));
}

std::string temp_name(const std::string& target) {
  const std::filesystem::path path(target);
  const std::string name = path.filename().string();
  PIPIT_CHECK(!name.empty(), "cannot replace '", target, "': the path names no file");
  const std::string temp = "." + name + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(temp_counter.fetch_add(1));
  return (std::filesystem::path(parent_directory(target)) / temp).string();
}

// Runs `make` (a system call returning -1 and setting errno on failure) on fresh temporary
// names until one is free; returns the name, with its result in *result.
template <typename Make>
std::string create_unique(FileStep step, const std::string& target, Make make, int* result) {
  for (int attempt = 1;; ++attempt) {
    std::string temp = temp_name(target);
    int err = injected(step, temp);
    if (!err) {
      *result = make(temp);
      if (*result >= 0) return temp;
      err = errno;
    }
    if (err != EEXIST || attempt == kCreateAttempts) fail("cannot create", temp, err);
  }
}

// Closes `fd` whatever happens (a retry could close a descriptor another thread just got);
// returns 0 or the errno.
int close_file(int fd, const std::string& path) {
  const int err = injected(FileStep::Close, path);
  const int rc = ::close(fd);
  return err ? err : rc < 0 ? errno : 0;
}

}  // namespace

std::string parent_directory(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

NewFile create_temp_file(const std::string& target) {
  NewFile file;
  file.path = create_unique(
      FileStep::Create, target,
      [](const std::string& temp) {
        return ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      },
      &file.fd);
  return file;
}

int remove_stale_temporaries(const std::string& target) {
  std::string prefix = ".";
  prefix.append(std::filesystem::path(target).filename().string()).append(".tmp.");
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent_directory(target), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // ".<name>.tmp.<pid>.<n>": the writer's pid, then its counter.
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos ||
        rest.find_first_not_of("0123456789.") != std::string::npos || rest.size() - dot < 2) {
      continue;
    }
    const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 ||
        errno != ESRCH) {
      continue;  // its writer may still be at work
    }
    std::error_code remove_ec;
    if (std::filesystem::remove_all(entry.path(), remove_ec) > 0 && !remove_ec) ++removed;
  }
  return removed;
}

NewFile create_new_file(const std::string& path) {
  int err = injected(FileStep::Create, path);
  const int fd = err ? -1 : ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", path, err ? err : errno);
  return {path, fd};
}

void finish_file(const NewFile& file, const std::string& contents,
                 const std::function<void(size_t, size_t)>& on_progress) {
  auto abandon = [&](const std::string& what, int err, bool open) {
    if (open) close_file(file.fd, file.path);
    ::unlink(file.path.c_str());
    fail(what, file.path, err);
  };
  if (int err = injected(FileStep::Write, file.path)) abandon("cannot write", err, true);
  size_t written = 0;
  while (written < contents.size()) {
    const size_t piece = std::min(kProgressPiece, contents.size() - written);
    const ssize_t n = ::write(file.fd, contents.data() + written, piece);
    if (n < 0 && errno == EINTR) continue;
    // write(2) returning 0 for a regular file sets no errno: report it as out of space.
    if (n <= 0) abandon("cannot write", n < 0 ? errno : ENOSPC, true);
    written += static_cast<size_t>(n);
    if (on_progress) on_progress(written, contents.size());
  }
  int err = injected(FileStep::Sync, file.path);
  if (!err && ::fsync(file.fd) != 0) err = errno;
  if (err) abandon("cannot fsync", err, true);
  if (int close_err = close_file(file.fd, file.path)) abandon("cannot close", close_err, false);
}

std::string create_temp_dir(const std::string& target) {
  int rc = -1;
  return create_unique(
      FileStep::MakeDir, target,
      [](const std::string& temp) { return ::mkdir(temp.c_str(), 0777); }, &rc);
}

void rename_path(const std::string& from, const std::string& to) {
  int err = injected(FileStep::Rename, to);
  if (!err && ::rename(from.c_str(), to.c_str()) != 0) err = errno;
  if (err) fail("cannot rename '" + from + "' onto", to, err);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  int err = injected(FileStep::Exchange, b);
#ifdef SYS_renameat2
  // Called directly: glibc wraps renameat2 only from 2.28 on.
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE in <linux/fs.h>
  if (!err &&
      ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) != 0) {
    err = errno;
  }
#else
  if (!err) err = ENOSYS;
#endif
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) return false;
  if (err) fail("cannot exchange '" + a + "' with", b, err);
  return true;
}

void fsync_directory(const std::string& dir) {
  int err = injected(FileStep::SyncDir, dir);
  int fd = -1;
  if (!err) {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) err = errno;
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (fd >= 0) ::close(fd);  // read-only: nothing its close could lose
  if (err) fail("cannot fsync directory", dir, err);
}

void set_file_fault_hook(FileFaultHook hook) {
  fault_hook = std::move(hook);
}

}  // namespace pipit
