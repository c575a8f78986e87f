#pragma once
#include <string>

namespace pipit {

// Replaces `path` with `contents` so that a crash at any moment leaves either the old file or
// the new one: write a temporary file beside it, fsync, rename over, fsync the directory.
void write_file_atomic(const std::string& path, const std::string& contents);
// The whole file; errors name the path.
std::string read_file(const std::string& path);

}  // namespace pipit
