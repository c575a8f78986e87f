#pragma once
// AccumulationHook: while one lives on a thread, that thread's backward passes call it each
// time they add a gradient into a leaf's grad() (after the addition, with the leaf), as
// PyTorch's post-accumulate-grad hooks do. A pipeline stage with replicas uses it to start
// summing a layer's gradients while the backward goes on with the layers below.
#include <functional>

#include "tensor/tensor.h"

namespace pipit {

class AccumulationHook {
 public:
  explicit AccumulationHook(std::function<void(const AutogradMeta& leaf)> hook);
  ~AccumulationHook();  // restores the hook it replaced
  AccumulationHook(const AccumulationHook&) = delete;
  AccumulationHook& operator=(const AccumulationHook&) = delete;

 private:
  std::function<void(const AutogradMeta&)> hook_;
  const std::function<void(const AutogradMeta&)>* previous_;
};

namespace detail {
// Calls this thread's hook, if any (AccumulateGrad::apply).
void gradient_accumulated(const AutogradMeta& leaf);
}  // namespace detail

}  // namespace pipit
