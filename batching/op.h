#pragma once
// Op: what a wrapped module or function is to the batching graph. `run` takes each input
// position's batch ([k, ...per-example shape]) and returns each output's batch ([k, ...]).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace pipit::batching {

struct Op {
  std::string name;
  int outputs = 1;
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)> run;
  // Anything else that decides which calls may share a batch, declared by the wrapper; calls
  // of one op also share a batch only when their inputs' per-example shapes and dtypes match.
  uint64_t extra = 0;
  // The same inputs give the same outputs, so a repeated call may reuse the first's node.
  bool pure = true;
  uint64_t id = 0;  // unique per Op (set by make_op)
};

std::shared_ptr<const Op> make_op(Op op);

}  // namespace pipit::batching
