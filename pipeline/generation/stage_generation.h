#pragma once
// StageGeneration: the part of a Stage (pipeline/stage.h) that serves pipelined generation
// (pipelined_generation.h). GenerateBegin gives each chunk a KV cache (nn/generate.h's
// CachedLayers); each GenerateStep then runs through this stage's consecutive chunks and goes
// on to the next chunk's stage, the last one's logits to the coordinator; GenerateEnd drops
// the caches.
#include <memory>
#include <vector>

#include "comm/message.h"
#include "nn/generate.h"

namespace pipit {

class Stage;

class StageGeneration {
 public:
  // Registers the handlers of generation's messages.
  explicit StageGeneration(Stage& stage);
  void reset() { caches_.clear(); }

 private:
  bool begin(Message message);
  bool step(Message message);
  bool end(Message message);
  void run(const Message& message);

  Stage& stage_;
  std::vector<std::unique_ptr<CachedLayers>> caches_;  // per local chunk, while generating
};

}  // namespace pipit
