#pragma once
// Tensor: a cheap handle (shared pointer) to storage + shape + strides + offset + dtype, plus
// optional autograd metadata. Copying a Tensor copies the handle, not the data.
// Differentiable operations are free functions in autograd/ops.h.
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace pipit {

class Node;
class Tensor;

// Autograd state of one tensor. Leaves that require grad accumulate into `grad`; results of
// differentiable ops point to the node that computes their inputs' gradients.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Tensor> grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> grad_accumulator;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A view of existing storage with explicit geometry (no autograd).
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                             int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  bool same_storage(const Tensor& other) const { return storage() == other.storage(); }
  // Nothing but this handle holds the tensor or its memory, and it is all of that memory, laid
  // out plainly, with no autograd state: whoever holds it may take it over and write into it.
  bool sole_owner() const;

  // Address of element [0, ..., 0]. The typed form checks the dtype.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    PIPIT_CHECK(dtype() == DTypeOf<T>::value, "data<T>: tensor has dtype ", dtype(),
                " but the requested type is ", DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  // The single value of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  // All values in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // Copies: a contiguous copy when needed (contiguous), always (clone), to another dtype or
  // device (to). All are differentiable for floating dtypes (autograd/copy.cpp).
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  // Same data, cut from the autograd graph.
  Tensor detach() const;

  // Autograd.
  bool requires_grad() const;
  Tensor& requires_grad_(bool value = true);
  Tensor grad() const;  // undefined when no gradient was accumulated
  void set_grad(const Tensor& grad);
  void zero_grad();  // drops the accumulated gradient
  std::shared_ptr<Node> grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // Backpropagates from this tensor: backward() needs a one-element tensor; backward(grad)
  // takes dL/dthis of this tensor's shape. Gradients accumulate into leaves' grad(). The
  // engine is autograd/engine.cpp; the graph's nodes, autograd/node.h.
  void backward() const;
  void backward(const Tensor& grad) const;

  TensorImpl& impl() const {
    PIPIT_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta();  // created on first use

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// A new contiguous tensor of `dtype` on `device` holding x's values, recording no graph: the
// copy Tensor's differentiable copies (autograd/copy.cpp) add their node to, and the one the
// layers below autograd/ (codec/, comm/) make.
Tensor copy_of(const Tensor& x, DType dtype, Device device);

// Prints shape, dtype, device and abbreviated values.
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

}  // namespace pipit
