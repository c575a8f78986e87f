// Replicas of a pipeline whose model ties GPT-2's head to its token embedding: each replica
// sums its two sides' gradients (source's + copy's, gradients/tied_parameters.h), then the
// replicas sum those tied gradients with the rest (gradients/replica_group.h, tied ones last),
// so training equals, bit for bit, one thread that accumulates each replica's share on the
// untied model, adds the sides, and adds the shares in replica order. In threads (with and
// without ZeRO-1) and over worker processes; under MPI: tests/mpi_test.cpp.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "distributed_reference.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using namespace pipit::testing;

namespace {

constexpr const char* kTiedHead = "8.weight";
constexpr const char* kTiedEmbedding = "0.tokens.weight";
constexpr int64_t kTiedRows = 24;  // r * m microbatches for every layout below

std::shared_ptr<Sequential> tied_replica_gpt() {
  Generator generator(5);
  GptConfig c{11, 6, 6, 2, 16, 0.0};
  c.tie_embeddings = true;
  c.head_bias = false;
  return gpt(c, &generator);
}

struct TiedReplicaRun {
  std::vector<double> losses;
  StateDict weights;
};

// One thread on the untied model: replica k's microbatches (k m .. k m + m - 1) accumulated
// from zero, each loss gradient scaled by 1 / (r m); the replica's two tied sides added; then
// every parameter's gradients added in replica order, and the update.
TiedReplicaRun accumulate_tied_by_replica(int replicas, int microbatches, int steps) {
  auto net = tied_replica_gpt()->untied_slice(0, 9);
  const Batch batch = gpt_batch(11, kTiedRows);
  const auto parameters = net->named_parameters();
  auto optimizer = make_optimizer(kAdamW, parameters);
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  const int n = replicas * microbatches;
  const int64_t size = kTiedRows / n;
  TiedReplicaRun run;
  for (int step = 0; step < steps; ++step) {
    std::map<std::string, Tensor> sums;
    double total = 0;
    for (int k = 0; k < replicas; ++k) {
      optimizer->zero_grad();
      for (int i = 0; i < microbatches; ++i) {
        const int64_t mb = k * microbatches + i;
        Tensor out = net->forward(narrow(batch.input, 0, mb * size, size));
        const Tensor y = narrow(batch.target, 0, mb * size, size);
        total += loss->compute_loss(out, y).item<double>();
        out.backward(loss->compute_gradient(out, y) * (1.0 / n));
      }
      NoGradGuard no_grad;
      std::map<std::string, Tensor> grads;
      for (const auto& [name, p] : parameters) grads[name] = p.grad().clone();
      grads[kTiedEmbedding] = grads.at(kTiedEmbedding) + grads.at(kTiedHead);
      grads[kTiedHead] = grads.at(kTiedEmbedding);
      for (const auto& [name, grad] : grads) sums[name] = k == 0 ? grad : sums.at(name) + grad;
    }
    for (const auto& [name, p] : parameters) {
      Tensor parameter = p;
      parameter.set_grad(sums.at(name).clone());
    }
    optimizer->step();
    run.losses.push_back(total / n);
  }
  run.weights = net->state_dict();
  run.weights.erase(kTiedHead);  // the tensor once, as the model and fetch_state hold it
  return run;
}

void check_tied_layout(const ReplicaLayout& layout, const Launch& launch) {
  INFO(layout.schedule << " p=" << layout.p << " r=" << layout.r << " v=" << layout.v
                       << " sharded optimizer " << layout.shard_optimizer);
  const int m = 4, steps = 3;
  const TiedReplicaRun expected = accumulate_tied_by_replica(layout.r, m, steps);
  const Batch batch = gpt_batch(11, kTiedRows);
  TiedReplicaRun got;
  {
    PipelineConfig config = replica_config(layout, m);
    config.timeout = std::chrono::milliseconds(20000);
    Pipeline pipeline(tied_replica_gpt(), config, launch);
    for (int step = 0; step < steps; ++step) {
      got.losses.push_back(pipeline.train_step(batch.input, batch.target));
    }
    got.weights = pipeline.coordinator().fetch_state().first;
  }
  CHECK(got.losses == expected.losses);
  check_bitwise_equal(got.weights, expected.weights);
}

}  // namespace

TEST_CASE("tied replicas equal per-replica accumulation with the sides summed, bit for bit",
          "[replicas][tied_pipeline]") {
  for (const ReplicaLayout& layout : std::vector<ReplicaLayout>{{"1f1b", 1, 2, 1},
                                                                {"1f1b", 2, 2, 1},
                                                                {"gpipe", 2, 3, 1},
                                                                {"1f1b", 4, 2, 1},
                                                                {"interleaved", 2, 2, 2},
                                                                {"zbh1", 2, 2, 1},
                                                                {"zbv", 2, 2, 2},
                                                                {"1f1b", 2, 2, 1, true},
                                                                {"zbv", 2, 3, 2, true}}) {
    check_tied_layout(layout, Launch::threads());
  }
}

TEST_CASE("tied replicas over worker processes equal per-replica accumulation, bit for bit",
          "[replicas][tied_pipeline][distributed]") {
  const Workers workers = start_workers(4, test_worker());
  for (const ReplicaLayout& layout :
       std::vector<ReplicaLayout>{{"1f1b", 2, 2, 1}, {"zbv", 2, 2, 2, true}}) {
    check_tied_layout(layout, Launch::workers(endpoints(workers)));
  }
}
