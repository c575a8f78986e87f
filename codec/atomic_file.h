#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace pipit {

// Replaces `path` with `contents` so that a crash at any moment leaves either the old file or
// the new one: write a temporary file beside it (a new name for every call, so concurrent
// writers each rename a complete file of their own), fsync, close, rename over, fsync the
// directory. Every failure throws naming the path; one before the rename leaves the old file
// as it was and no temporary behind.
//
// `on_progress(bytes done, bytes in all)`, when given, hears of each 8 MiB written or read: a
// progress line's input for files of gigabytes (checkpoints).
using ByteProgress = std::function<void(size_t, size_t)>;
void write_file_atomic(const std::string& path, const std::string& contents,
                       const ByteProgress& on_progress = {});
// The whole file; errors name the path.
std::string read_file(const std::string& path, const ByteProgress& on_progress = {});

}  // namespace pipit
