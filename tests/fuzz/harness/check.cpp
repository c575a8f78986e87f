#include "tests/fuzz/harness/check.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

namespace pipit::fuzz {

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type.name());
}

void require(bool condition, std::string_view what) {
  if (!condition) throw Finding(std::string(what));
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

bool same_tensors(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    if (ia->first != ib->first || !same_tensor(ia->second, ib->second)) return false;
  }
  return true;
}

bool same_message(const Message& a, const Message& b) {
  if (a.kind != b.kind || a.step != b.step || a.microbatch != b.microbatch || a.chunk != b.chunk ||
      a.meta != b.meta || a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (!same_tensor(a.tensors[i], b.tensors[i])) return false;
  }
  return true;
}

ScratchFile::ScratchFile(std::string_view tag, const uint8_t* data, size_t size) {
  path_ = (std::filesystem::temp_directory_path() /
           ("pipit-fuzz-" + std::to_string(::getpid()) + "-" + std::string(tag)))
              .string();
  std::ofstream out(path_, std::ios::binary | std::ios::trunc);
  if (size > 0) out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  // The harness machinery failing is no finding of the decoder's: stop loudly instead.
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write scratch file %s\n", path_.c_str());
    std::abort();
  }
}

ScratchFile::~ScratchFile() {
  std::error_code ignored;
  std::filesystem::remove(path_, ignored);
}

}  // namespace pipit::fuzz
