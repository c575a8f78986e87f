#include "tensor/device.h"

#include "tensor/error.h"
#ifdef PIPIT_WITH_CUDA
#include "tensor/cuda/cuda_device.h"
#endif

namespace pipit {

std::string Device::str() const {
  return kind == Kind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 9 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return cuda(std::stoi(text.substr(5)));
  }
  throw Error("device: cannot read \"" + text + "\" (expected cpu, cuda or cuda:N)");
}

int cuda_device_count() {
#ifdef PIPIT_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.str();
}

}  // namespace pipit
