#pragma once
// LogTail: the lines a child process has appended to its log file since the last look.
#include <fstream>
#include <string>
#include <vector>

namespace pipit::chaos {

class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {}

  // Complete lines written since the last call.
  std::vector<std::string> new_lines() {
    std::ifstream in(path_, std::ios::binary);
    std::vector<std::string> lines;
    if (!in) return lines;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += chunk.size();
    partial_ += chunk;
    for (size_t newline; (newline = partial_.find('\n')) != std::string::npos;) {
      lines.push_back(partial_.substr(0, newline));
      partial_.erase(0, newline + 1);
    }
    return lines;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  size_t offset_ = 0;
  std::string partial_;
};

// The whole file, or its last `max_bytes`.
inline std::string read_tail(const std::string& path, size_t max_bytes = 4000) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

}  // namespace pipit::chaos
