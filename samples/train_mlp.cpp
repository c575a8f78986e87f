// Trains an MLP classifier on synthetic data: Gaussian clusters, one per class.
#include <chrono>
#include <cstdio>

#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/run_flags.h"

using namespace pipit;

namespace {

// Each class is a Gaussian cloud around its own random centre.
std::pair<Tensor, Tensor> make_dataset(int64_t samples, int64_t features, int64_t classes,
                                       Generator& generator) {
  Tensor centres = normal({classes, features}, 0.0, 1.0, &generator);
  std::vector<int64_t> labels(static_cast<size_t>(samples));
  for (auto& label : labels) {
    label =
        static_cast<int64_t>(generator.bits(generator.reserve(1)) % static_cast<uint64_t>(classes));
  }
  Tensor y = from_vector(labels, {samples});
  Tensor x = embedding(centres, y) + normal({samples, features}, 0.0, 0.6, &generator);
  return {x, y};
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  std::vector<int64_t> predicted = argmax(logits, 1).to_vector<int64_t>();
  std::vector<int64_t> expected = labels.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == expected[i];
  return static_cast<double>(correct) / static_cast<double>(predicted.size());
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("train_mlp", "Trains an MLP on synthetic clustered data.");
  flags.add("features", "32", "input features");
  flags.add("classes", "8", "classes");
  flags.add("hidden", "128", "hidden width (two hidden layers)");
  flags.add("samples", "4096", "training samples");
  flags.add("batch", "256", "samples per step");
  flags.add("steps", "300", "optimizer steps");
  flags.add("lr", "0.05", "SGD learning rate");
  flags.add("momentum", "0.9", "SGD momentum");
  support::add_seed_flag(flags, "1", "data and weights");
  support::add_threads_flag(flags, "0", "all cores");
  flags.parse(argc, argv);

  try {
    const int64_t features = flags.integer("features"), classes = flags.integer("classes", 2);
    const int64_t hidden = flags.integer("hidden"), samples = flags.integer("samples");
    const int64_t batch = flags.integer("batch"), steps = flags.integer("steps");
    if (batch > samples) flags.fail("--batch must not exceed --samples");
    if (flags.integer("threads", 0) > 0)
      set_num_threads(static_cast<int>(flags.integer("threads")));
    Generator generator(support::seed_flag(flags));

    auto [x, y] = make_dataset(samples, features, classes, generator);
    auto model = mlp({features, hidden, hidden, classes}, "relu", &generator);
    SGD optimizer(model->named_parameters(), {flags.number("lr"), flags.number("momentum"), 0.0});
    CrossEntropyLoss loss_fn;

    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < steps; ++step) {
      int64_t begin = (step * batch) % (samples - batch + 1);
      Tensor xb = narrow(x, 0, begin, batch), yb = narrow(y, 0, begin, batch);
      optimizer.zero_grad();
      Tensor loss = loss_fn.compute_loss(model->forward(xb), yb);
      loss.backward();
      optimizer.step();
      if ((step + 1) % 50 == 0 || step == 0) {
        double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("step %4lld  loss %.4f  elapsed %.2fs\n", static_cast<long long>(step + 1),
                    loss.item<double>(), elapsed);
      }
    }
    NoGradGuard no_grad;
    std::printf("train accuracy %.2f%%\n", 100.0 * accuracy(model->forward(x), y));
  } catch (const pipit::Error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
