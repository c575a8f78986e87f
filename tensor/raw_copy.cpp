#include "tensor/raw_copy.h"

#include "tensor/backend.h"

namespace pipit {

Tensor copy_of(const Tensor& x, DType dtype, Device device) {
  Tensor out = Tensor::empty(x.shape(), dtype, device);
  // Cross-device copies belong to the accelerator's backend.
  backend(x.device().is_cpu() ? device : x.device()).copy(x, out);
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  return x.device() == device ? x : copy_of(x, x.dtype(), device);
}

Tensor host_contiguous(const Tensor& x) {
  if (x.device().is_cpu() && x.is_contiguous()) return x;
  Tensor host = Tensor::empty(x.shape(), x.dtype());
  backend(Device::cpu()).copy(to_device(x, Device::cpu()), host);
  return host;
}

}  // namespace pipit
