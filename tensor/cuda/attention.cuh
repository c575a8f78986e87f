#pragma once
// What the CUDA attention implementations share: the views they read and write, and the entry
// points attention.cu picks between. Included only by tensor/cuda/attention*.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "tensor/kernel_layout.h"

namespace pipit::cuda {

// One [B, H, T, D] operand: its data and its strides in elements (unit stride in D).
template <typename T>
struct HeadView {
  T* data;
  int64_t batch_stride, head_stride, row_stride;

  __host__ __device__ T* row(int64_t bh, int64_t heads, int64_t t) const {
    return data + (bh / heads) * batch_stride + (bh % heads) * head_stride + t * row_stride;
  }
};

template <typename T>
HeadView<T> head_view(const Tensor& t) {
  return {static_cast<T*>(t.raw_data()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

// A forward or backward call: sizes, scale, mask, and where lse and the row dots live.
struct AttentionGeometry {
  int64_t batch, heads, queries, keys, head_dim;
  double scale;
  bool causal;
  // Keys past the diagonal: query i sees keys < i + 1 + offset when causal.
  __host__ __device__ int64_t offset() const { return keys - queries; }
};

inline AttentionGeometry geometry(const AttentionSizes& n, double scale, bool causal) {
  return {n.batch, n.heads, n.queries, n.keys, n.head_dim, scale, causal};
}

// True when the tensor-core kernels take these operands: bf16/f16, head dim 32, 64 or 128, and
// every row 16-byte aligned (they move rows in 16-byte pieces).
bool attention_mma_supports(std::initializer_list<const Tensor*> operands);

// cuDNN's fused attention (attention_cudnn.cpp, built with the cuDNN frontend): whether it
// takes these operands, and the two passes. Same lse as pipit's kernels (f32, natural log).
bool attention_cudnn_supports(const Tensor& q, const Tensor& k, const AttentionGeometry& g);
void attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionGeometry& g, const Tensor& out, const Tensor& lse);
void attention_backward_cudnn(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse,
                              const AttentionGeometry& g, const Tensor& grad_q,
                              const Tensor& grad_k, const Tensor& grad_v);

// Tensor-core kernels (attention_mma.cu). lse and row_dots are f32 [B * H * Tq].
void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionGeometry& g, const Tensor& out, float* lse);
void attention_backward_mma(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const float* lse, const float* row_dots,
                            const AttentionGeometry& g, const Tensor& grad_q, const Tensor& grad_k,
                            const Tensor& grad_v);

}  // namespace pipit::cuda
