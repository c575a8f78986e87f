#pragma once
#include <ostream>
#include <string>

namespace pipit {

// Where a tensor's storage lives.
struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  bool operator==(const Device& other) const = default;
  std::string str() const;  // "cpu" or "cuda:0"
  // Inverse of str(); "cuda" means cuda:0. Throws naming the text it cannot read.
  static Device parse(const std::string& text);
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// CUDA devices usable by this process: 0 without a GPU, a driver, or a CUDA build.
int cuda_device_count();

}  // namespace pipit
