#include "autograd/accumulation_hook.h"

#include <utility>

namespace pipit {

namespace {
thread_local const std::function<void(const AutogradMeta&)>* t_hook = nullptr;
}  // namespace

AccumulationHook::AccumulationHook(std::function<void(const AutogradMeta& leaf)> hook)
    : hook_(std::move(hook)), previous_(t_hook) {
  t_hook = &hook_;
}

AccumulationHook::~AccumulationHook() {
  t_hook = previous_;
}

namespace detail {
void gradient_accumulated(const AutogradMeta& leaf) {
  if (t_hook) (*t_hook)(leaf);
}
}  // namespace detail

}  // namespace pipit
