#include "autograd/backward_hook.h"

#include "autograd/node.h"

namespace pipit {
namespace {

struct HookBackward : Node {
  std::function<void()> hook;
  std::vector<Tensor> apply(const Tensor& g) override {
    hook();
    return {g};
  }
  std::string name() const override { return "HookBackward"; }
};

}  // namespace

Tensor backward_hook(const Tensor& x, std::function<void()> hook) {
  Tensor out = Tensor::from_storage(x.storage(), x.shape(), x.strides(), x.offset(), x.dtype());
  if (auto node = detail::make_node<HookBackward>(out, {x})) node->hook = std::move(hook);
  return out;
}

}  // namespace pipit
