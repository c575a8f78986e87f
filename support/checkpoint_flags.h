#pragma once
// The checkpoint flags of the training programs that save and resume a run (train_gpt, the
// chaos trainer, which the chaos driver runs in train_gpt's place): --checkpoint-dir,
// --checkpoint-every and --resume.
#include <filesystem>
#include <string>

#include "support/flags.h"

namespace pipit::support {

inline void add_checkpoint_flags(Flags& flags) {
  flags.add("checkpoint-dir", "", "directory for checkpoint.safetensors");
  flags.add("checkpoint-every", "0", "steps between checkpoints (0: only at the end)");
  flags.add_switch("resume", "continue from the checkpoint in --checkpoint-dir");
}

struct CheckpointFlags {
  std::string dir;   // empty: no checkpoints
  std::string path;  // dir/checkpoint.safetensors
  int64_t every = 0;
  bool resume = false;
};

// The flags' values, the directory made; --resume and --checkpoint-every need a directory.
inline CheckpointFlags checkpoint_flags(const Flags& flags) {
  CheckpointFlags checkpoint{flags.str("checkpoint-dir"), "", flags.integer("checkpoint-every", 0),
                             flags.on("resume")};
  if ((checkpoint.resume || checkpoint.every > 0) && checkpoint.dir.empty()) {
    flags.fail("--resume and --checkpoint-every need --checkpoint-dir");
  }
  checkpoint.path = checkpoint.dir + "/checkpoint.safetensors";
  if (!checkpoint.dir.empty()) std::filesystem::create_directories(checkpoint.dir);
  return checkpoint;
}

}  // namespace pipit::support
