// backend(device): the one place that maps a device to its kernels.
#include "tensor/backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string_view>

#include "tensor/cpu/cpu_backend.h"
#ifdef PIPIT_WITH_CUDA
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_device.h"
#endif

namespace pipit {
namespace {

// Overrides by device: slot 0 is the CPU, 1 + i is cuda:i. Every op looks here first, so
// the check is one atomic load.
std::array<std::atomic<Backend*>, 17> overrides{};

std::atomic<Backend*>* override_slot(Device device) {
  const size_t slot = device.is_cpu() ? 0 : 1 + static_cast<size_t>(device.index);
  return device.index >= 0 && slot < overrides.size() ? &overrides[slot] : nullptr;
}

// PIPIT_BACKEND_OPS's entries spell each op's arguments beside its parameters, for code that
// forwards a call (OpTimer, cuda::OpTimer); a misspelt or reordered name must not wait for
// a CUDA build, nor pass it when the swapped parameters share a type.
constexpr bool is_identifier_char(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

constexpr std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// Whether `args`, as "(a, dims)", names the parameters of `params`, as
// "(const Tensor& a, std::span<const int64_t> dims)", in order.
constexpr bool arguments_name_parameters(std::string_view params, std::string_view args) {
  params = trim(params);
  args = trim(args);
  if (params.size() < 2 || params.front() != '(' || params.back() != ')' || args.size() < 2 ||
      args.front() != '(' || args.back() != ')')
    return false;
  params = params.substr(1, params.size() - 2);
  args = args.substr(1, args.size() - 2);
  while (true) {
    size_t comma = 0;  // the next comma outside <>, () and []
    for (int depth = 0; comma < params.size(); ++comma) {
      const char c = params[comma];
      if (c == '<' || c == '(' || c == '[') ++depth;
      if (c == '>' || c == ')' || c == ']') --depth;
      if (c == ',' && depth == 0) break;
    }
    const size_t arg_comma = std::min(args.find(','), args.size());
    const std::string_view param = trim(params.substr(0, comma));
    size_t name = param.size();
    while (name > 0 && is_identifier_char(param[name - 1])) --name;
    if (param.substr(name) != trim(args.substr(0, arg_comma))) return false;
    if (comma == params.size() || arg_comma == args.size())
      return comma == params.size() && arg_comma == args.size();
    params.remove_prefix(comma + 1);
    args.remove_prefix(arg_comma + 1);
  }
}

#define PIPIT_CHECK_ARGUMENTS(name, params, args)            \
  static_assert(arguments_name_parameters(#params, #args),   \
                "PIPIT_BACKEND_OPS: the arguments of " #name \
                " must be its parameters' names, in order");
PIPIT_BACKEND_OPS(PIPIT_CHECK_ARGUMENTS)
#undef PIPIT_CHECK_ARGUMENTS

}  // namespace

// Each in its enum's order (tensor/backend.h).
const char* op_name(UnaryOp op) {
  static constexpr const char* kNames[] = {"neg",  "exp",     "log",  "sqrt", "abs",
                                           "tanh", "sigmoid", "relu", "gelu"};
  static_assert(std::size(kNames) == static_cast<size_t>(UnaryOp::gelu) + 1);
  return kNames[static_cast<size_t>(op)];
}

const char* op_name(BinaryOp op) {
  // clang-format off
  static constexpr const char* kNames[] = {
      "add", "sub", "mul", "div", "pow", "maximum", "minimum", "relu_backward", "gelu_backward",
      "tanh_backward", "sigmoid_backward", "eq", "ne", "lt", "le", "gt", "ge"};
  // clang-format on
  static_assert(std::size(kNames) == static_cast<size_t>(BinaryOp::ge) + 1);
  return kNames[static_cast<size_t>(op)];
}

bool is_widening_add(const Tensor& a, const Tensor& b) {
  return (a.dtype() == DType::f32 && is_half(b.dtype())) ||
         (b.dtype() == DType::f32 && is_half(a.dtype()));
}

void check_widening_add(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  PIPIT_CHECK(op == BinaryOp::add && is_widening_add(a, b) && out.dtype() == DType::f32,
              op_name(op), ": operands of dtypes ", a.dtype(), " and ", b.dtype(), " into ",
              out.dtype(), " (only add takes two dtypes: F32 and a half one, into F32)");
}

const char* op_name(ReduceOp op) {
  static constexpr const char* kNames[] = {"sum", "max", "min"};
  static_assert(std::size(kNames) == static_cast<size_t>(ReduceOp::min) + 1);
  return kNames[static_cast<size_t>(op)];
}

Backend* set_backend_override(Device device, Backend* backend) {
  std::atomic<Backend*>* slot = override_slot(device);
  PIPIT_CHECK(slot, "set_backend_override: device ", device, " has no override slot");
  return slot->exchange(backend);
}

Backend& backend(Device device) {
  if (std::atomic<Backend*>* slot = override_slot(device)) {
    if (Backend* replaced = slot->load(std::memory_order_acquire)) return *replaced;
  }
  static CpuBackend cpu_backend;
  if (device.is_cpu()) return cpu_backend;
#ifdef PIPIT_WITH_CUDA
  static std::vector<CudaBackend> cuda_backends = [] {
    std::vector<CudaBackend> backends;
    for (int i = 0; i < cuda::device_count(); ++i) backends.emplace_back(i);
    return backends;
  }();
  PIPIT_CHECK(device.index >= 0 && device.index < static_cast<int>(cuda_backends.size()),
              "backend: device ", device, " is not available (", cuda_backends.size(),
              " CUDA devices present)");
  return cuda_backends[static_cast<size_t>(device.index)];
#else
  throw Error("backend: device " + device.str() +
              " is not available: pipit was built without CUDA (PIPIT_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace pipit
