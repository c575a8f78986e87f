#include <filesystem>
#include <iostream>

#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipit.h"
#include "serialize/model_io.h"

using namespace pipit;

int main() {
  manual_seed(0);

  // Tensors: NumPy broadcasting, views that share storage, autograd.
  Tensor x = randn({4, 3}).requires_grad_();
  Tensor y = sum(relu(x * 2.0 + tensor({1, -1, 0.5})));
  y.backward();
  std::cout << x.grad() << "\n";

  // A model is a Sequential of layers; a Loss and an Optimizer train it.
  auto model = mlp({3, 16, 2});
  AdamW optimizer(model->named_parameters(), {.lr = 1e-2});
  CrossEntropyLoss loss_fn;
  Tensor inputs = randn({64, 3});
  Tensor labels = gt(sum(inputs, {1}), scalar_tensor(0)).to(DType::i64);
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    Tensor loss = loss_fn.compute_loss(model->forward(inputs), labels);
    loss.backward();
    optimizer.step();
    if (step % 25 == 0) std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
  }

  // The same model as a pipeline: 2 stages train concurrently on 4 microbatches per batch,
  // and the accumulated gradients equal the full batch's, bit for bit on the CPU.
  Pipeline pipeline(model, {.stages = 2,
                            .microbatches = 4,
                            .schedule = "1f1b",
                            .optimizer = {{"type", "AdamW"}, {"lr", 1e-2}}});
  for (int step = 0; step < 20; ++step) {
    double loss = pipeline.train_step(inputs, labels);
    if (step % 10 == 0) std::cout << "pipelined step " << step << " loss " << loss << "\n";
  }

  // On disk: config.json (rebuilds the model) + model.safetensors (the weights).
  auto dir = std::filesystem::temp_directory_path() / "pipit_tour_model";
  save_model(*model, dir.string());
  auto restored = load_model(dir.string());
  std::cout << "restored " << restored->parameter_count() << " parameters\n";
}
