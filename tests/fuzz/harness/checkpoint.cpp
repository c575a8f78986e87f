// The checkpoint harness: fuzz bytes written to a file and loaded with load_checkpoint, as a
// resuming run does. An accepted checkpoint must save and load back the same, and is then
// restored the way a run resumes: the model rebuilt from its config with the weights loaded
// strictly, the optimizer made from its config with its state loaded.
#include <optional>

#include "codec/atomic_file.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "serialize/checkpoint.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {
namespace {

bool same_checkpoint(const Checkpoint& a, const Checkpoint& b) {
  return a.model_config == b.model_config && same_tensors(a.weights, b.weights) &&
         a.optimizer_config == b.optimizer_config &&
         same_tensors(a.optimizer_state, b.optimizer_state) && a.step == b.step &&
         a.rng_seed == b.rng_seed && a.rng_offset == b.rng_offset && a.extra == b.extra;
}

void resume(const Checkpoint& checkpoint) {
  refuses_only_with("restoring a loaded checkpoint", [&] {
    std::shared_ptr<Module> model = build_module(checkpoint.model_config);
    model->load_state_dict(checkpoint.weights);
    std::unique_ptr<Optimizer> optimizer =
        make_optimizer(checkpoint.optimizer_config, model->named_parameters());
    if (!checkpoint.optimizer_state.empty()) {
      optimizer->load_state_dict(checkpoint.optimizer_state);
    }
  });
}

}  // namespace

bool fuzz_checkpoint(const uint8_t* data, size_t size) {
  std::optional<Checkpoint> loaded;
  {
    const ScratchFile file("checkpoint", data, size);
    refuses_only_with("load_checkpoint", [&] { loaded = load_checkpoint(file.path()); });
  }
  if (!loaded) return false;

  Checkpoint back;
  {
    const ScratchFile file("checkpoint-again", nullptr, 0);
    must_not_throw("saving a loaded checkpoint and loading it again", [&] {
      save_checkpoint(file.path(), *loaded);
      back = load_checkpoint(file.path());
    });
  }
  require(same_checkpoint(back, *loaded), "a loaded checkpoint does not survive saving");
  resume(*loaded);
  return true;
}

std::vector<std::string> checkpoint_seeds() {
  std::vector<std::string> seeds;
  const auto add = [&](const Module& model, const Optimizer& optimizer, int64_t step,
                       nlohmann::json extra) {
    Checkpoint checkpoint{model.config(),
                          model.state_dict(),
                          optimizer.config(),
                          optimizer.state_dict(),
                          step,
                          0xfedcba9876543210ull,
                          12345,
                          std::move(extra)};
    const ScratchFile file("checkpoint-seed", nullptr, 0);
    save_checkpoint(file.path(), checkpoint);
    seeds.push_back(read_file(file.path()));
  };
  // An MLP after one AdamW step, so the optimizer state is real.
  Generator init(3);
  auto mlp_model = mlp({3, 4, 2}, "relu", &init);
  auto adamw = make_optimizer({{"type", "AdamW"}, {"lr", 0.01}}, mlp_model->named_parameters());
  MSELoss().compute_loss(mlp_model->forward(ones({2, 3})), zeros({2, 2})).backward();
  adamw->step();
  add(*mlp_model, *adamw, 1, {{"vocab", "abc"}});
  // A tiny GPT with a fresh SGD (no state but the step).
  auto gpt_model = gpt({5, 4, 1, 1, 4, 0.0}, &init);
  auto sgd = make_optimizer({{"type", "SGD"}, {"lr", 0.1}, {"momentum", 0.9}},
                            gpt_model->named_parameters());
  add(*gpt_model, *sgd, 0, nlohmann::json::object());
  return seeds;
}

}  // namespace pipit::fuzz
