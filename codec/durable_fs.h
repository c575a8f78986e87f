#pragma once
// The steps that replace files and directories durably on a POSIX file system. Each throws a
// pipit::Error naming the path and the system's reason; none leaves a temporary behind when
// it fails. Tests can make any step fail through a per-thread hook.
#include <cstddef>
#include <functional>
#include <string>

namespace pipit {

// A file being written: create_temp_file or create_new_file opened it, finish_file completes
// it.
struct NewFile {
  std::string path;
  int fd = -1;
};
// A temporary file beside `target`, created exclusively. Its name, ".<name>.tmp.<pid>.<n>"
// with n from a process-wide counter, is new for every call, so two threads replacing the same
// file never share one.
NewFile create_temp_file(const std::string& target);
// Removes the temporaries beside `target` (files or directories named as create_temp_file
// names them) whose writing process no longer runs: what a writer killed between creating
// and renaming left behind, which would otherwise pile up until the disk is full. A
// temporary of a live process is left alone; so is anything that cannot be removed. Returns
// how many were removed. (The pid is checked on this machine: on a file system shared
// between machines, a remote writer's temporary may be removed, which fails that write
// cleanly and never touches its target.)
int remove_stale_temporaries(const std::string& target);
// `path` itself, which must not exist yet.
NewFile create_new_file(const std::string& path);
// Writes `contents`, fsyncs and closes `file`; on any failure, the close included (on NFS a
// failed close can be the first sign of lost data), removes it and throws naming it.
// `on_progress(bytes written, bytes in all)` after each kProgressPiece, when given.
void finish_file(const NewFile& file, const std::string& contents,
                 const std::function<void(size_t, size_t)>& on_progress = {});
// How much is written or read between two progress reports.
constexpr size_t kProgressPiece = size_t{8} << 20;
// An empty directory beside `target`, named as create_temp_file names files.
std::string create_temp_dir(const std::string& target);

// rename(2); throws naming both paths.
void rename_path(const std::string& from, const std::string& to);
// Swaps two directories in one step (renameat2 RENAME_EXCHANGE). Returns false, having
// changed nothing, when the file system or kernel cannot; other failures throw.
bool exchange_paths(const std::string& a, const std::string& b);
// fsync of a directory: makes the entries renamed into it survive a crash.
void fsync_directory(const std::string& dir);
// The directory holding `path` ("." for a bare name).
std::string parent_directory(const std::string& path);

// Tests only: while set, the calling thread asks `hook` before each step with the path it acts
// on; a nonzero result makes that step fail with that errno (a file is closed all the same).
enum class FileStep { Create, Write, Sync, Close, MakeDir, Rename, Exchange, SyncDir };
using FileFaultHook = std::function<int(FileStep step, const std::string& path)>;
void set_file_fault_hook(FileFaultHook hook);

}  // namespace pipit
