#include "pipeline/generation/stage_generation.h"

#include "autograd/grad_mode.h"
#include "pipeline/protocol/generate_messages.h"
#include "pipeline/stage.h"

namespace pipit {

StageGeneration::StageGeneration(Stage& stage) : stage_(stage) {
  stage.on(PipelineKind::GenerateBegin,
           {nullptr, [this](Message m) { return begin(std::move(m)); }});
  stage.on(PipelineKind::GenerateEnd, {nullptr, [this](Message m) { return end(std::move(m)); }});
  // Like an activation: into chunk c from the coordinator (c = 0) or chunk c - 1's stage.
  stage.on(PipelineKind::GenerateStep,
           {[this](const Message& m) {
              const int c = m.chunk;
              if (c < 0 || c > stage_.last_chunk() || stage_.endpoint_of(c) != stage_.me()) {
                return false;
              }
              return m.from == (c == 0 ? kCoordinator : stage_.endpoint_of(c - 1));
            },
            [this](Message m) { return step(std::move(m)); }});
}

bool StageGeneration::begin(Message message) {
  const GenerateBegin begin = read_generate_begin(message);
  stage_.begin(message.step);
  for (const auto& c : stage_.spec_.chunks) {
    c->eval();
    caches_.push_back(
        std::make_unique<CachedLayers>(*c, begin.batch, begin.capacity, begin.padding));
  }
  for (const Message& early : stage_.take_early(PipelineKind::GenerateStep)) run(early);
  return true;
}

bool StageGeneration::step(Message message) {
  // Over TCP a neighbour's step can overtake the coordinator's GenerateBegin.
  if (message.step > stage_.step()) {
    stage_.keep_early(std::move(message));
  } else if (message.step == stage_.step() && !caches_.empty()) {
    run(message);
  }
  return true;
}

bool StageGeneration::end(Message message) {
  if (message.step == stage_.step()) stage_.reset();
  stage_.send_to_coordinator(Message(PipelineKind::GenerateEnd, message.step));
  return true;
}

void StageGeneration::run(const Message& message) {
  PIPIT_CHECK(message.tensors.size() == 1, "GenerateStep message carries ", message.tensors.size(),
              " tensors, expected 1");
  const int64_t start = read_generate_start(message);
  NoGradGuard no_grad;
  Tensor x = stage_.on_device(message.tensors[0]);
  // Through this stage's chunks while the next one is here too (a V's turn), then onwards.
  for (int c = message.chunk;; ++c) {
    x = caches_[static_cast<size_t>(stage_.local_chunk(c))]->forward(x, start);
    if (c == stage_.last_chunk()) {
      x = last_logits(x, x.shape().back());
    } else if (stage_.endpoint_of(c + 1) == stage_.me()) {
      continue;
    }
    Message out(PipelineKind::GenerateStep, stage_.step(), 0, c + 1, {x});
    out.meta = {{"start", start}};
    stage_.send(c == stage_.last_chunk() ? kCoordinator : stage_.endpoint_of(c + 1),
                std::move(out));
    return;
  }
}

}  // namespace pipit
