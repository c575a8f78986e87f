#include "tensor/tensor.h"

#include <cstring>
#include <iomanip>

#include "tensor/backend.h"

namespace pipit {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, "empty");
  // Byte offsets are int64 too (raw_data), and a wrapped size_t would allocate too little.
  int64_t nbytes = 0;
  PIPIT_CHECK(
      !__builtin_mul_overflow(shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), &nbytes),
      "empty: shape ", shape_str(shape), " of ", dtype,
      " is too large: its size in bytes overflows int64");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = backend(device).allocate(static_cast<size_t>(nbytes));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                            int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const {
  return shape()[normalize_dim(d, dim(), "size")];
}

bool Tensor::sole_owner() const {
  return impl_.use_count() == 1 && storage().use_count() == 1 && !impl().autograd &&
         is_contiguous() && offset() == 0 && storage()->nbytes() == nbytes();
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl().storage->data()) +
         offset() * static_cast<int64_t>(dtype_size(dtype()));
}

Tensor copy_of(const Tensor& x, DType dtype, Device device) {
  Tensor out = Tensor::empty(x.shape(), dtype, device);
  // Cross-device copies belong to the accelerator's backend.
  backend(x.device().is_cpu() ? device : x.device()).copy(x, out);
  return out;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = device().is_cpu() ? *this : copy_of(*this, dtype(), Device::cpu());
  Tensor converted = Tensor::empty(shape(), DTypeOf<T>::value);
  backend(Device::cpu()).copy(host, converted);
  const T* p = static_cast<const T*>(converted.raw_data());
  return std::vector<T>(p, p + numel());
}

template <typename T>
T Tensor::item() const {
  PIPIT_CHECK(numel() == 1, "item: tensor of shape ", shape_str(shape()), " has ", numel(),
              " elements, expected 1");
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

Tensor Tensor::detach() const {
  return from_storage(storage(), shape(), strides(), offset(), dtype());
}

AutogradMeta& Tensor::autograd_meta() {
  if (!impl().autograd) impl().autograd = std::make_shared<AutogradMeta>();
  return *impl().autograd;
}

bool Tensor::requires_grad() const {
  return impl().autograd && impl().autograd->requires_grad;
}

Tensor& Tensor::requires_grad_(bool value) {
  PIPIT_CHECK(!value || is_floating(dtype()),
              "requires_grad_: only floating tensors can require "
              "gradients, this one has dtype ",
              dtype());
  PIPIT_CHECK(is_leaf(), "requires_grad_: can only be set on leaf tensors (use detach() first)");
  autograd_meta().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl().autograd || !impl().autograd->grad) return Tensor();
  return *impl().autograd->grad;
}

void Tensor::set_grad(const Tensor& grad) {
  if (!grad.defined()) {
    if (impl().autograd) impl().autograd->grad.reset();
    return;
  }
  PIPIT_CHECK(grad.shape() == shape(), "set_grad: gradient shape ", shape_str(grad.shape()),
              " differs from tensor shape ", shape_str(shape()));
  autograd_meta().grad = std::make_shared<Tensor>(grad);
}

void Tensor::zero_grad() {
  set_grad(Tensor());
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  return impl().autograd ? impl().autograd->grad_fn : nullptr;
}

namespace {

void print_values(std::ostream& out, const std::vector<double>& values, const Shape& shape,
                  size_t dim, int64_t& index, int indent) {
  constexpr int64_t kEdge = 3;
  const int64_t n = shape[dim];
  const int64_t inner =
      shape_numel(Shape(shape.begin() + static_cast<int64_t>(dim) + 1, shape.end()));
  out << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      out << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      index += (n - 2 * kEdge) * inner;
      i = n - kEdge - 1;
      continue;
    }
    if (dim + 1 == shape.size()) {
      out << values[static_cast<size_t>(index++)];
    } else {
      print_values(out, values, shape, dim + 1, index, indent + 1);
    }
    if (i + 1 < n) out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  out << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  if (!tensor.defined()) return out << "Tensor(undefined)";
  out << "Tensor(shape=" << shape_str(tensor.shape()) << ", dtype=" << tensor.dtype()
      << ", device=" << tensor.device();
  if (tensor.requires_grad()) out << ", requires_grad";
  out << ")\n";
  std::vector<double> values = tensor.to_vector<double>();
  if (tensor.dim() == 0) return out << values[0];
  int64_t index = 0;
  auto flags = out.flags();
  out << std::setprecision(4);
  print_values(out, values, tensor.shape(), 0, index, 0);
  out.flags(flags);
  return out;
}

}  // namespace pipit
