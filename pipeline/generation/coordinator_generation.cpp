// The Coordinator's side of pipelined generation (pipeline/generation/pipelined_generation.h):
// the stages' KV caches are begun, stepped and ended by these three calls.
#include "pipeline/coordinator.h"
#include "pipeline/coordinator_busy.h"
#include "pipeline/protocol/generate_messages.h"

namespace pipit {

void Coordinator::generate_begin(const GenerateBegin& begin) {
  Busy busy(busy_, "generate_begin");
  require_consistent();
  ++step_;
  send_to_replica0(to_message(begin, step_));
}

Tensor Coordinator::generate_step(const Tensor& tokens, int64_t start) {
  Busy busy(busy_, "generate_step");
  Message message(PipelineKind::GenerateStep, step_, 0, 0, {tokens});
  message.meta = {{"start", start}};
  comm_->send(0, std::move(message));
  const int chunks = config_.stages * config_.chunks_per_stage;
  while (true) {
    Message reply =
        receive_step_message("the logits of generation step at position " + std::to_string(start));
    if (reply.kind == PipelineKind::GenerateStep && reply.chunk == chunks &&
        reply.tensors.size() == 1) {
      return reply.tensors[0];
    }
  }
}

void Coordinator::generate_end() {
  Busy busy(busy_, "generate_end");
  // Acknowledged: in one process the stages share the model's modules, and they must be back
  // in training mode before the caller touches the model again.
  send_to_replica0(Message(PipelineKind::GenerateEnd, step_));
  await_all(PipelineKind::GenerateEnd, "the end of generation", config_.stages);
}

}  // namespace pipit
