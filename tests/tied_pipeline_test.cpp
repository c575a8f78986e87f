// Tied parameters across pipeline stages (pipeline/gradients/tied_parameters.h): GPT-2's head tied
// to its token embedding, cut into stages that each keep a copy. Pipelined training equals
// sequential gradient accumulation on the untied model with the two sides' gradients added
// before each optimizer step, bit for bit, for every schedule and partition, in threads and
// over worker processes (MPI: tests/mpi_test.cpp); the copies stay equal, checkpoints hold
// the tensor once, and what cannot keep the tie is refused by name.
#include <catch2/catch.hpp>
#include <functional>
#include <set>
#include <tuple>

#include "distributed_reference.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using namespace pipit::testing;

namespace {

constexpr const char* kHead = "8.weight";
constexpr const char* kEmbedding = "0.tokens.weight";

// small_gpt's shape (9 layers) with GPT-2's head: tied, without bias.
std::shared_ptr<Sequential> tied_gpt() {
  Generator generator(5);
  GptConfig c{11, 6, 6, 2, 16, 0.0};
  c.tie_embeddings = true;
  c.head_bias = false;
  return gpt(c, &generator);
}

struct TiedRun {
  std::vector<double> losses;
  StateDict weights;
  double grad_norm = 0;
};

// Sequential gradient accumulation on the untied model: each side's gradient summed over the
// microbatches, then source's + copy's given to both before the optimizer step; the norm for
// clipping counts the tied tensor once.
TiedRun accumulate_sequentially(int microbatches, int steps, double max_grad_norm = 0) {
  auto net = tied_gpt()->untied_slice(0, 9);
  const Batch batch = gpt_batch();
  auto optimizer = make_optimizer(kAdamW, net->named_parameters());
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  Tensor head, embedding;
  std::vector<Tensor> counted;
  for (const auto& [name, p] : net->named_parameters()) {
    if (name == kHead) head = p;
    if (name == kEmbedding) embedding = p;
    if (name != kHead) counted.push_back(p);
  }
  REQUIRE(&head.impl() != &embedding.impl());
  TiedRun run;
  const int64_t size = batch.input.size(0) / microbatches;
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();
    double total = 0;
    for (int i = 0; i < microbatches; ++i) {
      Tensor x = narrow(batch.input, 0, i * size, size),
             y = narrow(batch.target, 0, i * size, size);
      Tensor out = net->forward(x);
      total += loss->compute_loss(out, y).item<double>();
      out.backward(loss->compute_gradient(out, y) * (1.0 / microbatches));
    }
    {
      NoGradGuard no_grad;
      const Tensor sum = embedding.grad() + head.grad();
      embedding.set_grad(sum);
      head.set_grad(sum.clone());
      if (max_grad_norm > 0) {
        run.grad_norm = std::sqrt(grad_norm_squared(counted));
        scale_gradients(net->parameters(), clip_coefficient(run.grad_norm, max_grad_norm));
      }
    }
    optimizer->step();
    run.losses.push_back(total / microbatches);
  }
  run.weights = net->state_dict();
  CHECK(bitwise_equal(run.weights.at(kHead), run.weights.at(kEmbedding)));
  run.weights.erase(kHead);
  return run;
}

PipelineConfig config(const std::string& schedule, int p, int m, int v,
                      const std::string& recompute = "none") {
  PipelineConfig c;
  c.stages = p;
  c.microbatches = m;
  c.chunks_per_stage = v;
  c.schedule = schedule;
  c.recompute = recompute;
  c.optimizer = kAdamW;
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

}  // namespace

TEST_CASE(
    "a tied model pipelined equals sequential accumulation with the sides summed, bit for bit",
    "[tied_pipeline]") {
  const TiedRun expected = accumulate_sequentially(4, 3);
  struct Case {
    std::string schedule;
    int p, v;
  };
  for (const auto& [schedule, p, v] : std::vector<Case>{{"gpipe", 1, 1},
                                                        {"1f1b", 1, 1},
                                                        {"gpipe", 2, 1},
                                                        {"1f1b", 2, 1},
                                                        {"1f1b", 3, 1},
                                                        {"1f1b", 4, 1},
                                                        {"interleaved", 2, 2},
                                                        {"interleaved", 4, 2},
                                                        {"zbh1", 3, 1},
                                                        {"zbh2", 4, 1},
                                                        {"zbv", 1, 2},
                                                        {"zbv", 2, 2},
                                                        {"zbv", 4, 2}}) {
    for (const std::string recompute : {"none", "full"}) {
      INFO(schedule << " p=" << p << " v=" << v << " recompute " << recompute);
      auto model = tied_gpt();
      const Batch batch = gpt_batch();
      std::vector<double> losses;
      {
        Pipeline pipeline(model, config(schedule, p, 4, v, recompute));
        for (int step = 0; step < 3; ++step) {
          losses.push_back(pipeline.train_step(batch.input, batch.target));
        }
        check_bitwise_equal(pipeline.coordinator().fetch_state().first, expected.weights);
      }
      CHECK(losses == expected.losses);
      // The model the user holds is still tied, and trained.
      check_bitwise_equal(model->state_dict(), expected.weights);
      auto* head = dynamic_cast<Linear*>((*model)[8].get());
      REQUIRE(head != nullptr);
      CHECK(&head->weight.impl() == &model->state_dict().at(kEmbedding).impl());
    }
  }
}

TEST_CASE("clipping across stages counts a tied tensor once", "[tied_pipeline]") {
  const double max_norm = 0.05;
  const TiedRun expected = accumulate_sequentially(2, 1, max_norm);
  REQUIRE(expected.grad_norm > max_norm);  // the clip really scales
  auto model = tied_gpt();
  PipelineConfig c = config("1f1b", 2, 2, 1);
  c.max_grad_norm = max_norm;
  Pipeline pipeline(model, c);
  const Batch batch = gpt_batch();
  pipeline.train_step(batch.input, batch.target);
  CHECK(pipeline.coordinator().last_step().grad_norm == Approx(expected.grad_norm).epsilon(1e-6));
}

TEST_CASE("a tied model resumes from fetched state bit for bit", "[tied_pipeline]") {
  const Batch batch = gpt_batch();
  auto straight = tied_gpt();
  std::vector<double> losses;
  {
    Pipeline pipeline(straight, config("1f1b", 4, 4, 1));
    for (int step = 0; step < 3; ++step)
      losses.push_back(pipeline.train_step(batch.input, batch.target));
  }
  auto first = tied_gpt();
  StateDict weights, optimizer;
  {
    Pipeline pipeline(first, config("1f1b", 4, 4, 1));
    for (int step = 0; step < 2; ++step) pipeline.train_step(batch.input, batch.target);
    std::tie(weights, optimizer) = pipeline.coordinator().fetch_state();
  }
  CHECK_FALSE(weights.count(kHead));
  for (const auto& [name, value] : optimizer) CHECK(name.rfind("8.", 0) != 0);
  auto resumed = tied_gpt();
  resumed->load_state_dict(weights);
  // Another partition on resume: the head's copy takes the embedding's optimizer state.
  Pipeline pipeline(resumed, config("interleaved", 2, 4, 2), Launch::threads(), optimizer);
  CHECK(pipeline.train_step(batch.input, batch.target) == losses[2]);
  check_bitwise_equal(resumed->state_dict(), straight->state_dict());
}

TEST_CASE("remaps, rebalancing and ties between distant stages are refused by name",
          "[tied_pipeline]") {
  auto model = tied_gpt();
  Pipeline pipeline(model, config("1f1b", 2, 2, 1));
  const auto error = [](const std::function<void()>& run) {
    try {
      run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THAT(error([&] {
               pipeline.coordinator().remap({{0, 4}, {4, 9}});
             }),
             Catch::Contains("ties '8.weight' to '0.tokens.weight'"));
  PipelineConfig rebalancing = config("1f1b", 2, 2, 1);
  rebalancing.rebalance.enabled = true;
  CHECK_THAT(error([&] { Pipeline again(tied_gpt(), rebalancing); }),
             Catch::Contains("rebalancing: the model ties"));

  // A tie between layers 4 and 0 of an MLP, on stages 2 and 0 of 4: not ring neighbours.
  Generator generator(1);
  auto net = mlp({6, 6, 6, 6, 6}, "tanh", &generator);
  net->tie("4.weight", "0.weight");
  PipelineConfig apart = config("1f1b", 4, 4, 1);
  apart.layer_counts = {2, 2, 2, 1};
  CHECK_THAT(error([&] { Pipeline distant(net, apart); }),
             Catch::Contains("'4.weight' (stage 2) is tied to '0.weight' (stage 0)"));
}

TEST_CASE("a tied model over 4 worker processes equals the threads, bit for bit",
          "[tied_pipeline][distributed]") {
  Workers workers = start_workers(4, test_worker());
  const Batch batch = gpt_batch();
  struct Case {
    std::string schedule;
    int v;
  };
  for (const auto& [schedule, v] :
       std::vector<Case>{{"1f1b", 1}, {"interleaved", 2}, {"zbh2", 1}, {"zbv", 2}}) {
    INFO(schedule);
    auto local = tied_gpt();
    std::vector<double> local_losses, remote_losses;
    {
      Pipeline pipeline(local, config(schedule, 4, 4, v));
      for (int step = 0; step < 3; ++step) {
        local_losses.push_back(pipeline.train_step(batch.input, batch.target));
      }
    }
    auto remote = tied_gpt();
    StateDict weights;
    {
      Pipeline pipeline(remote, config(schedule, 4, 4, v), Launch::workers(endpoints(workers)));
      INFO(logs(workers));
      for (int step = 0; step < 3; ++step) {
        remote_losses.push_back(pipeline.train_step(batch.input, batch.target));
      }
      weights = pipeline.coordinator().fetch_state().first;
    }
    CHECK(remote_losses == local_losses);
    check_bitwise_equal(weights, local->state_dict());
    remote->load_state_dict(weights);  // strict: the tied tensor once, under its own name
  }
}
