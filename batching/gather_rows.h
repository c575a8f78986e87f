#pragma once
// gather_rows: the executor's one indexed copy. Row r of the result is row rows[r].row of
// sources[rows[r].source], whatever the number of sources, so a batch's inputs gathered from
// several earlier batches cost one copy, not a stack of per-example slices. Differentiable:
// each source's gradient is the result's gradient rows added back where they came from.
#include <cstdint>
#include <vector>

#include "autograd/ops.h"

namespace pipit::batching {

struct RowRef {
  int32_t source = 0;
  int64_t row = 0;
};

// Every source has the same dtype, device and shape after dim 0. CPU tensors are copied row
// by row (gradients: f32); others go through cat and embedding.
Tensor gather_rows(const std::vector<Tensor>& sources, const std::vector<RowRef>& rows);

}  // namespace pipit::batching
