#include "autograd/elementwise.h"

#include "autograd/node.h"
#include "autograd/shape_ops.h"
#include "tensor/backend.h"
#include "tensor/factory.h"

namespace pipit {
namespace {

// A widening add (backend.h) may pair f32 with a half dtype.
void check_pair(const Tensor& a, const Tensor& b, const char* op, bool widening = false) {
  PIPIT_CHECK(a.dtype() == b.dtype() || (widening && is_widening_add(a, b)), op,
              ": dtypes differ (", a.dtype(), " ", shape_str(a.shape()), " and ", b.dtype(), " ",
              shape_str(b.shape()), ")");
  PIPIT_CHECK(a.device() == b.device(), op, ": devices differ (", a.device(), " and ", b.device(),
              ")");
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, DType out_dtype) {
  const char* name = op_name(op);
  check_pair(a, b, name, op == BinaryOp::add);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  NoGradGuard no_grad;
  backend(a).binary(op, expand(a, shape), expand(b, shape), out);
  return out;
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  return binary_raw(op, a, b, a.dtype());
}

Tensor unary_raw(UnaryOp op, const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend(x).unary(op, x, out);
  return out;
}

// Backward of a two-input op: each input's gradient, reduced to the input's shape and in its
// dtype (a widening add's half operand gets its gradient rounded).
struct BinaryNode : Node {
  Shape a_shape, b_shape;
  DType a_dtype = DType::f32, b_dtype = DType::f32;
  std::vector<Tensor> reduce(const Tensor& ga, const Tensor& gb) {
    auto shaped = [](const Tensor& g, const Shape& shape, DType dtype) {
      if (!g.defined()) return g;
      const Tensor reduced = sum_to(g, shape);
      return reduced.dtype() == dtype ? reduced : reduced.to(dtype);
    };
    return {shaped(ga, a_shape, a_dtype), shaped(gb, b_shape, b_dtype)};
  }
};

template <typename N>
std::shared_ptr<N> binary_node(Tensor& out, const Tensor& a, const Tensor& b) {
  auto node = detail::make_node<N>(out, {a, b});
  if (node) {
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    node->a_dtype = a.dtype();
    node->b_dtype = b.dtype();
  }
  return node;
}

struct AddBackward : BinaryNode {
  std::vector<Tensor> apply(const Tensor& g) override { return reduce(g, g); }
  std::string name() const override { return "AddBackward"; }
};

struct SubBackward : BinaryNode {
  std::vector<Tensor> apply(const Tensor& g) override { return reduce(g, neg(g)); }
  std::string name() const override { return "SubBackward"; }
};

struct MulBackward : BinaryNode {
  Tensor a, b;
  std::vector<Tensor> apply(const Tensor& g) override {
    return reduce(next[0] ? mul(g, b) : Tensor(), next[1] ? mul(g, a) : Tensor());
  }
  std::string name() const override { return "MulBackward"; }
};

struct DivBackward : BinaryNode {
  Tensor a, b;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor ga = div(g, b);
    return reduce(ga, next[1] ? neg(mul(ga, div(a, b))) : Tensor());
  }
  std::string name() const override { return "DivBackward"; }
};

struct PowBackward : BinaryNode {
  Tensor a, b, out;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor ga = next[0] ? mul(g, mul(b, pow(a, sub(b, scalar_like(b, 1.0))))) : Tensor();
    Tensor gb = next[1] ? mul(g, mul(out, log(a))) : Tensor();
    return reduce(ga, gb);
  }
  std::string name() const override { return "PowBackward"; }
};

// Gradient flows to the selected input; ties split it evenly, as PyTorch does.
struct SelectBackward : BinaryNode {
  Tensor a, b;
  bool is_max = true;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor half = mul(g, scalar_like(g, 0.5));
    Tensor zero = scalar_like(g, 0.0);
    Tensor a_wins = is_max ? gt(a, b) : lt(a, b);
    Tensor tie = eq(a, b);
    Tensor ga = where(a_wins, g, where(tie, half, zero));
    Tensor gb = where(a_wins, zero, where(tie, half, g));
    return reduce(ga, gb);
  }
  std::string name() const override { return "SelectBackward"; }
};

template <typename N>
struct UnaryNode : Node {
  Tensor saved;  // input or output, as the formula needs
  std::string name() const override { return N::kName; }
};

struct NegBackward : UnaryNode<NegBackward> {
  static constexpr const char* kName = "NegBackward";
  std::vector<Tensor> apply(const Tensor& g) override { return {neg(g)}; }
};
struct ExpBackward : UnaryNode<ExpBackward> {
  static constexpr const char* kName = "ExpBackward";
  std::vector<Tensor> apply(const Tensor& g) override { return {mul(g, saved)}; }
};
struct LogBackward : UnaryNode<LogBackward> {
  static constexpr const char* kName = "LogBackward";
  std::vector<Tensor> apply(const Tensor& g) override { return {div(g, saved)}; }
};
struct SqrtBackward : UnaryNode<SqrtBackward> {
  static constexpr const char* kName = "SqrtBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    return {div(g, mul(saved, scalar_like(saved, 2.0)))};
  }
};
struct AbsBackward : UnaryNode<AbsBackward> {
  static constexpr const char* kName = "AbsBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor zero = scalar_like(g, 0.0);
    return {where(gt(saved, zero), g, where(lt(saved, zero), neg(g), zero))};
  }
};
struct TanhBackward : UnaryNode<TanhBackward> {
  static constexpr const char* kName = "TanhBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    return {binary_raw(BinaryOp::tanh_backward, g, saved)};
  }
};
struct SigmoidBackward : UnaryNode<SigmoidBackward> {
  static constexpr const char* kName = "SigmoidBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    return {binary_raw(BinaryOp::sigmoid_backward, g, saved)};
  }
};
struct ReluBackward : UnaryNode<ReluBackward> {
  static constexpr const char* kName = "ReluBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    return {binary_raw(BinaryOp::relu_backward, g, saved)};
  }
};
struct GeluBackward : UnaryNode<GeluBackward> {
  static constexpr const char* kName = "GeluBackward";
  std::vector<Tensor> apply(const Tensor& g) override {
    return {binary_raw(BinaryOp::gelu_backward, g, saved)};
  }
};

template <typename N>
Tensor unary_op(UnaryOp op, const Tensor& x, bool save_output) {
  Tensor out = unary_raw(op, x);
  if (auto node = detail::make_node<N>(out, {x}))
    node->saved = save_output ? out.detach() : x.detach();
  return out;
}

struct WhereBackward : Node {
  Tensor mask;
  Shape a_shape, b_shape;
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor zero = scalar_like(g, 0.0);
    return {Tensor(), next[1] ? sum_to(where(mask, g, zero), a_shape) : Tensor(),
            next[2] ? sum_to(where(mask, zero, g), b_shape) : Tensor()};
  }
  std::string name() const override { return "WhereBackward"; }
};

}  // namespace

Tensor scalar_like(const Tensor& x, double value) {
  return full({}, value, {x.dtype(), x.device()});
}

namespace {

// Two floating dtypes meet in the wider one, as in torch (f16 with bf16 in f32): so autocast's
// half activations join f32 residuals (add reads them as they are; the other ops get a copy).
// The narrower operand is cast inside the graph, so its gradient goes back in its own dtype.
// Other mixes are left for binary_raw to refuse.
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype() || !is_floating(a.dtype()) || !is_floating(b.dtype())) return {a, b};
  const DType common = a.dtype() == DType::f64 || b.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return {a.to(common), b.to(common)};
}

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  if (is_widening_add(a_in, b_in)) {
    // No f32 copy of the half operand: the kernel widens it as it reads.
    Tensor out = binary_raw(BinaryOp::add, a_in, b_in, DType::f32);
    binary_node<AddBackward>(out, a_in, b_in);
    return out;
  }
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::add, a, b);
  binary_node<AddBackward>(out, a, b);
  return out;
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::sub, a, b);
  binary_node<SubBackward>(out, a, b);
  return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::mul, a, b);
  if (auto node = binary_node<MulBackward>(out, a, b)) {
    if (b.requires_grad()) node->a = a.detach();
    if (a.requires_grad()) node->b = b.detach();
  }
  return out;
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::div, a, b);
  if (auto node = binary_node<DivBackward>(out, a, b)) {
    node->a = a.detach();
    node->b = b.detach();
  }
  return out;
}

Tensor pow(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::pow, a, b);
  if (auto node = binary_node<PowBackward>(out, a, b)) {
    node->a = a.detach();
    node->b = b.detach();
    node->out = out.detach();
  }
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  return pow(a, scalar_like(a, exponent));
}

Tensor maximum(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::maximum, a, b);
  if (auto node = binary_node<SelectBackward>(out, a, b)) {
    node->a = a.detach();
    node->b = b.detach();
  }
  return out;
}

Tensor minimum(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_raw(BinaryOp::minimum, a, b);
  if (auto node = binary_node<SelectBackward>(out, a, b)) {
    node->a = a.detach();
    node->b = b.detach();
    node->is_max = false;
  }
  return out;
}

Tensor neg(const Tensor& x) {
  return unary_op<NegBackward>(UnaryOp::neg, x, false);
}
Tensor exp(const Tensor& x) {
  return unary_op<ExpBackward>(UnaryOp::exp, x, true);
}
Tensor log(const Tensor& x) {
  return unary_op<LogBackward>(UnaryOp::log, x, false);
}
Tensor sqrt(const Tensor& x) {
  return unary_op<SqrtBackward>(UnaryOp::sqrt, x, true);
}
Tensor abs(const Tensor& x) {
  return unary_op<AbsBackward>(UnaryOp::abs, x, false);
}
Tensor tanh(const Tensor& x) {
  return unary_op<TanhBackward>(UnaryOp::tanh, x, true);
}
Tensor sigmoid(const Tensor& x) {
  return unary_op<SigmoidBackward>(UnaryOp::sigmoid, x, true);
}
Tensor relu(const Tensor& x) {
  return unary_op<ReluBackward>(UnaryOp::relu, x, false);
}
Tensor gelu(const Tensor& x) {
  return unary_op<GeluBackward>(UnaryOp::gelu, x, false);
}

Tensor eq(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::eq, a, b, DType::b8);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::ne, a, b, DType::b8);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::lt, a, b, DType::b8);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::le, a, b, DType::b8);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::gt, a, b, DType::b8);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary_raw(BinaryOp::ge, a, b, DType::b8);
}

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  PIPIT_CHECK(mask.dtype() == DType::b8, "where: mask must have dtype BOOL, got ", mask.dtype());
  check_pair(a, b, "where");
  Shape shape =
      broadcast_shapes(broadcast_shapes(mask.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  {
    NoGradGuard no_grad;
    backend(a).where(expand(mask, shape), expand(a, shape), expand(b, shape), out);
  }
  if (auto node = detail::make_node<WhereBackward>(out, {mask, a, b})) {
    node->mask = mask.detach();
    node->a_shape = a.shape();
    node->b_shape = b.shape();
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, scalar_like(x, value), x);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator-(const Tensor& x) {
  return neg(x);
}
Tensor operator+(const Tensor& a, double b) {
  return add(a, scalar_like(a, b));
}
Tensor operator-(const Tensor& a, double b) {
  return sub(a, scalar_like(a, b));
}
Tensor operator*(const Tensor& a, double b) {
  return mul(a, scalar_like(a, b));
}
Tensor operator/(const Tensor& a, double b) {
  return div(a, scalar_like(a, b));
}
Tensor operator+(double a, const Tensor& b) {
  return add(scalar_like(b, a), b);
}
Tensor operator-(double a, const Tensor& b) {
  return sub(scalar_like(b, a), b);
}
Tensor operator*(double a, const Tensor& b) {
  return mul(scalar_like(b, a), b);
}
Tensor operator/(double a, const Tensor& b) {
  return div(scalar_like(b, a), b);
}

}  // namespace pipit
