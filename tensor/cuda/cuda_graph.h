#pragma once
// cuda::Graph: the GPU work of a training step's forward and backward, recorded once and then
// replayed with one launch (torch.cuda.CUDAGraph). A GPT-2 step queues about 400 kernels; a
// replay costs the host one call, and the GPU runs them without waiting for the host between.
//
//   optimizer.zero_grad();                  // the capture's backward then sets the gradients
//   cuda::Graph graph(device);
//   Tensor loss;
//   graph.capture([&] { loss = loss_fn.compute_loss(model->forward(x), y); loss.backward(); });
//   for (...) {
//     backend(x).copy(next_tokens, x);      // new inputs go into the captured tensors
//     graph.replay();                       // loss and every parameter's grad are rewritten
//     optimizer.step();                     // eager: its step count and rate change per step
//   }
//
// A replay repeats exactly what the capture queued: the same kernels on the same memory with
// the same host-side scalars. So the work captured must read its inputs from tensors the
// caller refills (x, y, the parameters) and keep its results in tensors it returns (the loss,
// the gradients); it must not copy between host and device or draw random numbers (both are
// refused with an Error), and the autograd graph is walked only at capture. Tensors made inside
// the capture keep their memory (the graph's pool) while the Graph lives. Out-of-range
// indices in a replay surface at the next synchronize(device), naming the op, as outside one.
#include <functional>
#include <memory>

#include "tensor/device.h"

namespace pipit::cuda {

class Graph {
 public:
  explicit Graph(Device device);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs `work` once on this Graph's own stream with capture on: its kernels are recorded, not
  // run. Run the same work eagerly at least once first, so that cuBLAS and cuDNN have chosen
  // and built their algorithms outside the capture. One capture per Graph.
  void capture(const std::function<void()>& work);
  // Queues the recorded work after everything queued on this thread's current stream, and
  // makes that stream wait for it.
  void replay();
  bool captured() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pipit::cuda
