#pragma once
// TaskRunner: the part of a Stage (pipeline/stage.h) that runs a step's tasks. At the step's
// start it builds the stage's line of the schedule; then it runs the tasks one at a time, in
// that order, each as soon as its input (an activation or a gradient) has arrived, and sends
// each result on to the neighbouring stage or to the coordinator. Forwards stash what their
// backward needs (with recomputation only the input, and where the random streams stood); a
// split backward's weight gradients (W) wait for their turn after its input gradient (I).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/split_backward.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/rebalancing/layer_timer.h"
#include "pipeline/schedules/task.h"
#include "pipeline/trace.h"

namespace pipit {

class Stage;

class TaskRunner {
 public:
  // Registers the handlers of activations and gradients with `stage`.
  explicit TaskRunner(Stage& stage);

  // A step begins: its tasks, and the inputs that came before it.
  void begin(const StepBegin& begin);
  // An activation or gradient for a task of this step.
  void store(Message message);
  // Runs the tasks whose inputs are here; true once the step's last task is done.
  bool run_ready();
  bool active() const { return active_; }
  bool training() const { return training_; }
  bool tracing() const { return record_trace_; }
  bool done() const { return next_task_ == tasks_.size(); }
  const std::vector<Task>& tasks() const { return tasks_; }
  // The task running or next to run, for errors ("in task F3.1").
  const Task* current() const;
  // Around each task: a hook that sees the task's gradients become final, if `watch` gives
  // one; `finished` after it. (The gradients' sum over replicas goes layer by layer.)
  std::function<std::function<void(const AutogradMeta&)>(size_t task)> watch;
  std::function<void(size_t task)> finished;

  // The step's report: peaks, busy times, trace and (profiled) layer times.
  void report(StageDone& done) const;
  void add_trace(const TraceEvent& event) { trace_.add(event); }
  void end_step();
  void reset();

 private:
  bool accepts(const Message& message) const;
  bool receive(Message message);
  void run(const Task& task, const Tensor& input);
  void forward(const Task& task, const Tensor& input);
  void backward(const Task& task, const Tensor& grad);
  void input_grad(const Task& task, const Tensor& grad);
  void weight_grad(const Task& task);
  struct Stashed;
  // The stash entry of a task's forward, checked against its gradient; with recompute, the
  // forward runs again here.
  Stashed take_stashed(const Task& task, const Tensor& grad);
  void recompute(const Task& task, Stashed& stashed);
  // The chunk's forward on a leaf made from `input`, building the graph its backward needs.
  void forward_with_grad(const Task& task, const Tensor& input, Stashed& stashed);
  void send_input_grad(const Task& task, const Tensor& leaf);
  void record(const Task& task, double start, double end);
  std::vector<LayerTiming> layer_timings() const;

  Stage& stage_;
  LayerTimer timer_;
  bool active_ = false;
  bool training_ = false;
  bool record_trace_ = false;
  int microbatches_ = 0;
  std::vector<Task> tasks_;
  size_t next_task_ = 0;
  // Inputs that arrived, by (phase, microbatch, chunk).
  std::map<std::tuple<Phase, int, int>, Tensor> inputs_;
  // A forward awaiting its backward: its input leaf and output, and where a split backward's
  // I stops (the leaf, or the first layer's output when the input needs no gradient); with
  // recompute only the input, and where the chunk's random streams stood before it.
  struct Stashed {
    Tensor leaf, output, split_at;
    std::vector<uint64_t> rng_offsets;
  };
  // By (microbatch, chunk).
  std::map<std::pair<int, int>, Stashed> stash_;
  // Weight gradients (W) awaiting their turn after their I: (microbatch, chunk) -> work.
  std::map<std::pair<int, int>, DeferredGradients> deferred_;
  // Under bf16/f16 autocast, each weight rounded once for the whole step rather than once per
  // microbatch (and again in each recompute): open from a step's first forward to its end,
  // before the optimizer changes the weights. The stage's thread opens and closes it
  // (CastCache is per thread).
  std::optional<CastCache> weights_rounded_;
  // When the running task recomputed its forward first: that part's start and end.
  std::optional<std::pair<double, double>> recomputed_;
  size_t peak_stashed_ = 0;
  size_t peak_deferred_ = 0;
  Trace trace_;
  std::vector<double> chunk_busy_us_;  // per local chunk, this step
};

}  // namespace pipit
