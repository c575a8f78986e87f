#pragma once
// LayerTimer: runs a stage's chunks layer by layer when the stage profiles a step or is slowed
// on purpose. Forward passes are timed layer by layer; backward passes through a hook after
// each layer's output (autograd/backward_hook.h), which fires when that layer's backward
// begins, i.e. when the layer after it has finished. A slowdown factor f stretches every
// layer's forward and backward to f times its duration (a slower machine, for tests and
// benchmarks on one computer; time the thread waited for a core is not stretched), so the
// times measured are the stretched ones, as they would be on that machine. Otherwise the
// chunk runs as one call, with nothing added.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "autograd/split_backward.h"
#include "nn/sequential.h"
#include "pipeline/protocol/messages.h"

namespace pipit {

class LayerTimer {
 public:
  explicit LayerTimer(double slowdown = 1.0);

  // A new step; `profile`: record each layer's times until the next begin_step.
  void begin_step(bool profile);
  bool profiling() const { return profile_; }
  double slowdown() const { return slowdown_; }

  // chunk.forward(x), layer by layer when profiling or slowed, or when `first_output` asks
  // for the first layer's output.
  Tensor forward(Sequential& chunk, const Tensor& x, Tensor* first_output = nullptr);
  // output.backward(grad) for an output of forward(), its layers timed by their hooks.
  void backward(Sequential& chunk, const Tensor& output, const Tensor& grad);
  // The same split (autograd/split_backward.h): the part that reaches `input` now, timed like
  // backward; the weight gradients later. A slowdown stretches both.
  DeferredGradients backward_inputs(Sequential& chunk, const Tensor& output, const Tensor& grad,
                                    const Tensor& input);
  void weight_gradients(Sequential& chunk, DeferredGradients& deferred);

  // The step's times so far, by layer (output and state bytes left for the stage to fill).
  const std::map<int64_t, LayerTiming>& layers() const { return layers_; }

 private:
  using Clock = std::chrono::steady_clock;
  // A moment, and how long this thread had waited for a core by then (slowed stages only).
  struct Mark {
    Clock::time_point wall;
    int64_t waited_ns = 0;
  };
  bool stepwise() const { return profile_ || slowdown_ != 1.0; }
  Mark mark() const;
  // Waits (slowdown - 1) x the time since `since` less the time this thread waited for a
  // core meanwhile: on a machine with fewer cores than stages, the factor stretches the work,
  // not the wait for a core. Returns the whole time since `since` in us.
  double stretch(const Mark& since) const;
  // Runs a backward pass (or part of one) whose layers' hooks time them.
  void timed_backward(Sequential& chunk, const std::function<void()>& run);
  // Called by the hook after `layer`: the layer after it has finished its backward.
  void backward_reached(int64_t layer);

  double slowdown_;
  bool profile_ = false;
  std::map<int64_t, LayerTiming> layers_;
  // The backward in progress: the layer whose backward is running, and since when.
  int64_t running_ = -1;
  Mark since_;
};

}  // namespace pipit
