#pragma once
// Stage: one worker of the pipeline. It owns its model chunks, their optimizer and a
// Communicator, and serves messages: each kind goes to the part that owns it, through a table
// the parts fill when the stage is built:
//   - the task runner (schedules/task_runner.h): a step's forwards and backwards, in its
//     schedule's order, each as soon as its input is in;
//   - the gradients (gradients/stage_gradients.h): after the tasks, tied parameters' sums
//     across stages and the sum over replicas; then the optimizer's (ZeRO-1 sharded) update;
//   - remapping (rebalancing/stage_remap.h): layers moving between stages between steps;
//   - generation (generation/stage_generation.h): KV-cached steps through the chunks.
// The stage itself begins and ends steps, keeps data that overtook its step's start, and
// reports failures to the coordinator.
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "pipeline/stage_spec.h"
#include "tensor/stream.h"

namespace pipit {

class TaskRunner;
class StageGradients;
class StageRemap;
class StageGeneration;

class Stage {
 public:
  Stage(StageSpec spec, std::shared_ptr<Communicator> communicator);
  ~Stage();
  // Serves steps until a Shutdown message arrives, the coordinator's connection is lost or the
  // communicator closes. A task that throws is reported to the coordinator as a RoleError;
  // the stage then awaits the next step.
  void run();

  const StageSpec& spec() const { return spec_; }
  Optimizer& optimizer() { return *optimizer_; }

 private:
  friend class TaskRunner;
  friend class StageGradients;
  friend class StageRemap;
  friend class StageGeneration;

  // A part's handling of one message kind: whether the sender may send it (commands come
  // only from the coordinator, data only from the stage that produces it), then what to do.
  // Handlers return false once the stage should stop.
  struct Handler {
    std::function<bool(const Message&)> accepts;
    std::function<bool(Message)> handle;
  };
  void on(MessageKind kind, Handler handler);

  Message next_message();
  bool handle(Message message);
  bool accepts(const Message& message) const;
  void report_error(const std::string& message);
  void begin_step(const Message& message);
  bool peer_lost(const Message& message);
  void send_state(int64_t step);

  // For the parts. Resets every part and makes `step` the one in progress.
  void begin(int64_t step);
  int64_t step() const { return step_; }
  // Data of a later step that overtook its start: kept, at most kMaxEarlyMessages, until
  // that step begins and its part takes them.
  void keep_early(Message message);
  std::vector<Message> take_early(MessageKind kind);
  // While a task runs: each message already here goes to `take`; those it leaves (false)
  // wait, in order, for the loop.
  void pump(const std::function<bool(const Message&)>& take);
  void send(int to, Message message);
  void send_to_coordinator(Message message);
  // A received tensor on this stage's device, its memory guarded for our stream's use.
  Tensor on_device(const Tensor& received);
  // Makes `chunks` the stage's chunks, with a fresh optimizer of the same config over their
  // parameters, loaded from `optimizer_state` when it is not empty.
  void adopt(std::vector<std::shared_ptr<Sequential>> chunks, const nlohmann::json& optimizer,
             const StateDict& optimizer_state);
  void zero_grad();
  // Runs the tasks that can run; after the last one, the gradients' exchange and sums.
  void advance();
  // Reports the step to the coordinator once its tasks and sums are done.
  void finish_step();
  void reset();
  Sequential& chunk(int global_chunk);
  int local_chunk(int global_chunk) const;
  int last_chunk() const { return spec_.stages * spec_.chunks_per_stage - 1; }
  // The endpoint of stage `stage` of this stage's replica, and this stage's own.
  int endpoint(int stage) const;
  int me() const { return endpoint(spec_.stage); }
  // The endpoint of the stage (of this replica) that holds global chunk `chunk`.
  int endpoint_of(int chunk) const;
  // "stage s", or "stage s of replica k", for errors.
  std::string name() const;

  StageSpec spec_;
  std::shared_ptr<Communicator> comm_;
  // The stream run() queues this stage's GPU work on (a stream of its own on a CUDA device).
  Stream stream_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Tensor> parameters_;
  // parameters_ without the copies of tied parameters, which the source's stage counts.
  std::vector<Tensor> norm_parameters_;
  std::map<MessageKind, Handler> handlers_;
  int64_t step_ = -1;
  bool report_grad_norm_ = false;
  std::vector<Message> early_;
  static constexpr size_t kMaxEarlyMessages = 1 << 16;
  // Messages pump() took from the communicator and left for the loop, in order.
  std::deque<Message> interrupted_;
  std::unique_ptr<TaskRunner> tasks_;
  std::unique_ptr<StageGradients> gradients_;
  std::unique_ptr<StageRemap> remap_;
  std::unique_ptr<StageGeneration> generation_;
};

}  // namespace pipit
