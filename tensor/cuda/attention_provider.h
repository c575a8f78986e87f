#pragma once
// Which implementation CudaBackend::attention runs for bf16/f16 operands. f32 and f64 always
// run pipit's kernels (tensor/cuda/attention.cu).
namespace pipit::cuda {

enum class AttentionProvider {
  // cuDNN's fused attention where this build has it and it takes the call (Tq == Tk > 1, head dim
  // a multiple of 8 up to 128, an sm_80 or newer GPU), else pipit's kernels.
  automatic,
  // pipit's own kernels (tensor cores for head dims 32, 64, 128).
  pipit,
  // cuDNN's fused SDPA through the cuDNN frontend's graph API, with its deterministic
  // backward; a call it cannot take is an error.
  cudnn,
};

// For every thread and device; throws for cudnn in a build without the cuDNN frontend.
void set_attention_provider(AttentionProvider provider);
AttentionProvider attention_provider();
// Whether this build has the cuDNN frontend (tools/install_deps.sh installs its headers).
bool cudnn_attention_built();

}  // namespace pipit::cuda
