#include "tensor/cuda/cuda_graph.h"

#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/index_check.h"
#include "tensor/stream.h"

namespace pipit::cuda {

struct Graph::State {
  Device device;
  // Independent of the default stream, so that capturing on it does not trip over other
  // threads' default-stream work. The allocator keys free blocks by stream, so the blocks the
  // capture allocated stay this stream's: no other work is handed memory the graph writes.
  Stream stream;  // its destruction frees the graph's blocks (forget_stream_blocks)
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Recorded on the caller's stream before a replay and on ours after it.
  cudaEvent_t before = nullptr, after = nullptr;
  std::vector<IndexCheck> checks;

  explicit State(Device d) : device(d), stream(Stream::create_independent(d)) {}
};

namespace {

cudaStream_t handle(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.handle());
}

// Ends the capture in progress and forgets what it recorded.
void abandon_capture(cudaStream_t stream) {
  cudaGraph_t partial = nullptr;
  cudaStreamEndCapture(stream, &partial);
  if (partial) cudaGraphDestroy(partial);
  cudaGetLastError();  // the capture's own error was already reported
}

}  // namespace

Graph::Graph(Device device) {
  PIPIT_CHECK(device.is_cuda(), "cuda::Graph: ", device.str(), " is not a CUDA device");
  DeviceGuard guard(device.index);
  state_ = std::make_unique<State>(device);
  keep_stream_blocks(device.index, state_->stream.handle());
  PIPIT_CUDA_CHECK("cuda graph", cudaEventCreateWithFlags(&state_->before, cudaEventDisableTiming));
  PIPIT_CUDA_CHECK("cuda graph", cudaEventCreateWithFlags(&state_->after, cudaEventDisableTiming));
}

Graph::~Graph() {
  DeviceGuard guard(state_->device.index);
  // The last replay finishes before its graph and events go; the stream goes after them,
  // freeing the graph's blocks.
  cudaStreamSynchronize(handle(state_->stream));
  if (state_->exec) cudaGraphExecDestroy(state_->exec);
  if (state_->graph) cudaGraphDestroy(state_->graph);
  cudaEventDestroy(state_->before);
  cudaEventDestroy(state_->after);
  cudaGetLastError();  // unreportable here; it must not stick to the next op
}

bool Graph::captured() const {
  return state_->exec != nullptr;
}

void Graph::capture(const std::function<void()>& work) {
  PIPIT_CHECK(!captured(), "cuda::Graph::capture: this Graph already holds a capture");
  PIPIT_CHECK(!capturing(), "cuda::Graph::capture: this thread is already capturing");
  State& s = *state_;
  DeviceGuard guard(s.device.index);
  StreamGuard on_stream(s.stream);
  const cudaStream_t stream = handle(s.stream);
  prepare_index_checks(stream);
  // Relaxed, so that a library's lazy set-up on a stream it has not seen (a cudaMalloc) does
  // not fail the capture; what a replay cannot repeat pipit refuses by itself, and waiting for
  // the capturing stream still fails, naming the op.
  PIPIT_CUDA_CHECK("cuda::Graph::capture",
                   cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  set_capturing(true);
  try {
    work();
  } catch (const std::exception& e) {
    set_capturing(false);
    abandon_capture(stream);
    throw Error(detail::concat("cuda::Graph::capture: ", e.what()));
  }
  set_capturing(false);
  PIPIT_CUDA_CHECK("cuda::Graph::capture", cudaStreamEndCapture(stream, &s.graph));
  const cudaError_t status = cudaGraphInstantiate(&s.exec, s.graph, 0);
  if (status != cudaSuccess) {
    cudaGraphDestroy(s.graph);
    s.graph = nullptr;
    throw_cuda_error("cuda::Graph::capture", "cudaGraphInstantiate", status);
  }
  s.checks = captured_index_checks(stream);
}

void Graph::replay() {
  PIPIT_CHECK(captured(), "cuda::Graph::replay: nothing captured yet");
  PIPIT_CHECK(!capturing(), "cuda::Graph::replay: not inside a capture");
  State& s = *state_;
  DeviceGuard guard(s.device.index);
  const auto caller = static_cast<cudaStream_t>(current_stream_handle(s.device.index));
  const cudaStream_t stream = handle(s.stream);
  PIPIT_CUDA_CHECK("cuda::Graph::replay", cudaEventRecord(s.before, caller));
  PIPIT_CUDA_CHECK("cuda::Graph::replay", cudaStreamWaitEvent(stream, s.before, 0));
  PIPIT_CUDA_CHECK("cuda::Graph::replay", cudaGraphLaunch(s.exec, stream));
  PIPIT_CUDA_CHECK("cuda::Graph::replay", cudaEventRecord(s.after, stream));
  PIPIT_CUDA_CHECK("cuda::Graph::replay", cudaStreamWaitEvent(caller, s.after, 0));
  requeue_index_checks(stream, s.checks);
}

}  // namespace pipit::cuda
