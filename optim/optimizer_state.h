#pragma once
// Internal helpers shared by the optimizers' step and state-dict code.
#include <string>

#include "tensor/state_dict.h"

namespace pipit::detail {

Tensor contiguous_grad(const std::string& name, const Tensor& param);
void load_state_tensor(const StateDict& state, const std::string& key, const Tensor& into);
Tensor clone_tensor(const Tensor& t);
int64_t load_step(const StateDict& state);

}  // namespace pipit::detail
