// Pipelines times data parallelism (PipelineConfig::replicas): p stages x r replicas train
// bit for bit like one thread that accumulates each replica's share of the microbatches on
// its own and adds the shares in replica order, for every schedule, in threads and over TCP
// worker processes, and every replica ends with the model's weights; with the optimizer
// sharded over the replicas (ZeRO-1) too.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "bitwise.h"
#include "distributed_reference.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using pipit::testing::bitwise_equal;
using pipit::testing::Model;
using testing::kAdamW;
using testing::start_workers;
using testing::test_worker;
using testing::Workers;

namespace {

// 24 rows: r * m microbatches for every (r, m) below.
constexpr int64_t kRows = 24;

// One thread: replica k's share (microbatches k*m .. k*m+m-1) accumulated from zero, each
// loss gradient scaled by 1 / (r m), then the shares added in replica order, then the update.
std::vector<double> accumulate_by_replica(Model& model, int replicas, int microbatches, int steps) {
  const auto parameters = model.net->named_parameters();
  auto optimizer = make_optimizer(kAdamW, parameters);
  auto loss = make_loss({{"type", "CrossEntropyLoss"}});
  const int n = replicas * microbatches;
  const int64_t size = model.input.size(0) / n;
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<Tensor> sums(parameters.size());
    double total = 0;
    for (int k = 0; k < replicas; ++k) {
      optimizer->zero_grad();
      for (int i = 0; i < microbatches; ++i) {
        const int64_t mb = k * microbatches + i;
        Tensor x = narrow(model.input, 0, mb * size, size);
        Tensor y = narrow(model.target, 0, mb * size, size);
        Tensor out = model.net->forward(x);
        total += loss->compute_loss(out, y).item<double>();
        out.backward(loss->compute_gradient(out, y) * (1.0 / n));
      }
      NoGradGuard no_grad;
      for (size_t j = 0; j < parameters.size(); ++j) {
        const Tensor grad = parameters[j].second.grad().clone();
        sums[j] = k == 0 ? grad : sums[j] + grad;
      }
    }
    for (size_t j = 0; j < parameters.size(); ++j) {
      Tensor parameter = parameters[j].second;
      parameter.set_grad(sums[j]);
    }
    optimizer->step();
    losses.push_back(total / n);
  }
  return losses;
}

// What replica k's stages hold, under the model's names.
StateDict weights_of_replica(Pipeline& pipeline, int replica, int stages) {
  StateDict weights;
  for (int s = 0; s < stages; ++s) {
    for (const auto& chunk : pipeline.stage(replica * stages + s).spec().chunks) {
      weights.merge(chunk->state_dict());
    }
  }
  return weights;
}

// The trained model's weights (`got`) and every other replica's are exactly `want`.
void check_weights(const StateDict& want, const StateDict& got,
                   const std::vector<StateDict>& replica_weights) {
  for (const auto& [name, value] : want) {
    INFO(name);
    CHECK(bitwise_equal(got.at(name), value));
    for (const StateDict& replica : replica_weights) {
      REQUIRE(replica.count(name));
      CHECK(bitwise_equal(replica.at(name), value));
    }
  }
}

std::vector<ReplicaLayout> layouts() {
  std::vector<ReplicaLayout> all;
  for (const auto& [p, r] : std::vector<std::pair<int, int>>{{1, 2}, {2, 2}, {2, 3}, {4, 2}}) {
    for (const std::string schedule : {"gpipe", "1f1b", "zbh1", "zbh2"})
      all.push_back({schedule, p, r, 1});
    all.push_back({"interleaved", p, r, 2});
    all.push_back({"zbv", p, r, 2});
  }
  return all;
}

// Under ZeRO-1: each of a stage's parameters is updated (its exp_avg held) by exactly one
// replica of the stage, and no replica holds much more than 1/r of the elements.
void check_state_held_once(Pipeline& pipeline, const ReplicaLayout& layout) {
  for (int s = 0; s < layout.p; ++s) {
    int64_t total = 0, largest = 0;
    std::map<std::string, int> holders;
    for (const auto& chunk : pipeline.stage(s).spec().chunks) {
      for (const auto& [name, p] : chunk->named_parameters()) {
        holders[name] = 0;
        total += p.numel();
        largest = std::max(largest, p.numel());
      }
    }
    for (int k = 0; k < layout.r; ++k) {
      int64_t held = 0;
      for (const auto& [name, value] : pipeline.stage(k * layout.p + s).optimizer().state_dict()) {
        const std::string suffix = ".exp_avg";
        if (name.size() <= suffix.size() ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
          continue;
        }
        const std::string parameter = name.substr(0, name.size() - suffix.size());
        REQUIRE(holders.count(parameter));
        ++holders[parameter];
        held += value.numel();
      }
      CHECK(held <= total / layout.r + largest);
    }
    for (const auto& [name, count] : holders) {
      INFO("stage " << s << " " << name);
      CHECK(count == 1);
    }
  }
}

// `layout` over TCP worker processes (the first p * r of `workers`), with `recompute`, against
// the one-thread reference, bit for bit; `move`: between the steps every replica's stage 1
// hands a layer to its stage 0, worker to worker, which changes nothing.
void check_over_tcp(const ReplicaLayout& layout, const std::string& recompute, bool move,
                    const pipit::testing::Workers& workers) {
  INFO(layout.schedule << " p=" << layout.p << " r=" << layout.r << " sharded optimizer "
                       << layout.shard_optimizer << " recompute " << recompute);
  const int m = 4, steps = 2;
  Model reference = testing::make_gpt(kRows);
  const std::vector<double> expected = accumulate_by_replica(reference, layout.r, m, steps);
  Model remote = testing::make_gpt(kRows);
  PipelineConfig config = replica_config(layout, m);
  config.recompute = recompute;
  std::vector<std::string> endpoints;
  for (int e = 0; e < layout.p * layout.r; ++e) {
    endpoints.push_back(workers[static_cast<size_t>(e)]->endpoint());
  }
  std::vector<double> losses;
  StateDict weights;
  {
    Pipeline pipeline(remote.net, config, Launch::workers(endpoints));
    for (int step = 0; step < steps; ++step) {
      if (step == 1 && move) pipeline.move_layers(1, 0, 1);
      losses.push_back(pipeline.train_step(remote.input, remote.target));
    }
    weights = pipeline.coordinator().fetch_state().first;
  }
  CHECK(losses == expected);
  for (const auto& [name, value] : reference.net->state_dict()) {
    INFO(name);
    REQUIRE(weights.count(name));
    CHECK(bitwise_equal(weights.at(name), value));
  }
}

}  // namespace

TEST_CASE(
    "p stages x r replicas equal per-replica accumulation summed in replica order, bit for bit",
    "[replicas]") {
  const int m = 4, steps = 2;
  for (const std::string model_name : {"mlp", "gpt"}) {
    for (const ReplicaLayout& layout : layouts()) {
      for (const std::string recompute : {"none", "full"}) {
        INFO(model_name << " " << layout.schedule << " p=" << layout.p << " r=" << layout.r
                        << " v=" << layout.v << " recompute " << recompute);
        Model reference = testing::make_model(model_name, kRows);
        const std::vector<double> expected_losses =
            accumulate_by_replica(reference, layout.r, m, steps);

        Model piped = testing::make_model(model_name, kRows);
        PipelineConfig config = replica_config(layout, m);
        config.recompute = recompute;
        std::vector<double> losses;
        std::vector<StateDict> replica_weights;
        {
          Pipeline pipeline(piped.net, config);
          for (int step = 0; step < steps; ++step) {
            losses.push_back(pipeline.train_step(piped.input, piped.target));
          }
          for (int k = 1; k < layout.r; ++k) {
            replica_weights.push_back(weights_of_replica(pipeline, k, layout.p));
          }
        }
        CHECK(losses == expected_losses);
        check_weights(reference.net->state_dict(), piped.net->state_dict(), replica_weights);
      }
    }
  }
}

TEST_CASE(
    "ZeRO-1: sharded optimizers give the unsharded bits, each replica updating and holding "
    "its share",
    "[replicas]") {
  const int m = 4, steps = 3;
  int run = 0;
  for (const std::string model_name : {"mlp", "gpt"}) {
    // Every schedule and (p, r) of the test above, with and without recomputation in turn.
    for (const ReplicaLayout& layout : layouts()) {
      const std::string recompute = run++ % 2 == 0 ? "none" : "full";
      INFO(model_name << " " << layout.schedule << " p=" << layout.p << " r=" << layout.r
                      << " recompute " << recompute);
      PipelineConfig config = replica_config(layout, m);
      config.recompute = recompute;
      config.max_grad_norm = 0.5;  // the clipping factor reaches every replica's shard
      Model whole = testing::make_model(model_name, kRows);
      std::vector<double> expected;
      StateDict want_optimizer;
      {
        Pipeline pipeline(whole.net, config);
        for (int step = 0; step < steps; ++step) {
          expected.push_back(pipeline.train_step(whole.input, whole.target));
        }
        want_optimizer = pipeline.coordinator().fetch_state().second;
      }
      config.shard_optimizer = true;
      Model sharded = testing::make_model(model_name, kRows);
      std::vector<double> losses;
      StateDict got_optimizer;
      std::vector<StateDict> replica_weights;
      {
        Pipeline pipeline(sharded.net, config);
        for (int step = 0; step < steps; ++step) {
          losses.push_back(pipeline.train_step(sharded.input, sharded.target));
        }
        got_optimizer = pipeline.coordinator().fetch_state().second;
        check_state_held_once(pipeline, layout);
        for (int k = 1; k < layout.r; ++k) {
          replica_weights.push_back(weights_of_replica(pipeline, k, layout.p));
        }
      }
      CHECK(losses == expected);
      check_weights(whole.net->state_dict(), sharded.net->state_dict(), replica_weights);
      CHECK(got_optimizer.size() == want_optimizer.size());
      for (const auto& [name, value] : want_optimizer) {
        INFO(name);
        REQUIRE(got_optimizer.count(name));
        CHECK(bitwise_equal(got_optimizer.at(name), value));
      }
    }
  }
}

TEST_CASE(
    "replicas: a batch that does not split into r x m microbatches, bad counts and remaps "
    "are refused by name",
    "[replicas]") {
  Model model = testing::make_mlp(kRows);
  PipelineConfig config;
  config.stages = 2;
  config.replicas = 0;
  CHECK_THROWS_WITH(Pipeline(model.net, config), Catch::Contains("replicas must be in [1, "));
  config.replicas = 1;
  config.shard_optimizer = true;
  CHECK_THROWS_WITH(Pipeline(model.net, config), Catch::Contains("needs replicas > 1, got 1"));
  config.replicas = 2;
  config.shard_optimizer = false;
  config.microbatches = 5;
  Pipeline pipeline(model.net, config);
  CHECK_THROWS_WITH(pipeline.train_step(model.input, model.target),
                    Catch::Contains("does not split into 10 equal microbatches"));
}

TEST_CASE(
    "replicas: remaps move the same layers in every replica, training exactly as none, with "
    "the optimizer sharded (ZeRO-1) or not",
    "[replicas][remap]") {
  std::mt19937_64 random(29);
  for (const auto& [model_name, layout] : std::vector<std::pair<std::string, ReplicaLayout>>{
           {"gpt", {"1f1b", 2, 2, 1}},
           {"mlp", {"interleaved", 2, 2, 2}},
           {"mlp", {"gpipe", 3, 2, 1}},
           {"gpt", {"1f1b", 2, 2, 1, true}},
           {"mlp", {"interleaved", 2, 3, 2, true}}}) {
    INFO(model_name << " " << layout.schedule << " p=" << layout.p << " r=" << layout.r
                    << " sharded optimizer " << layout.shard_optimizer);
    PipelineConfig config = replica_config(layout, 4), plain_config = config;
    plain_config.shard_optimizer = false;
    Model plain_model = testing::make_model(model_name, kRows),
          moved_model = testing::make_model(model_name, kRows);
    Pipeline plain(plain_model.net, plain_config), moved(moved_model.net, config);
    const size_t chunks = static_cast<size_t>(layout.p * layout.v);
    for (int step = 0; step < 4; ++step) {
      // Random cuts: chunk c ends at cuts[c], each holding at least one layer.
      std::vector<size_t> cuts;
      for (size_t l = 1; l < moved_model.net->size(); ++l) cuts.push_back(l);
      std::shuffle(cuts.begin(), cuts.end(), random);
      cuts.resize(chunks - 1);
      std::sort(cuts.begin(), cuts.end());
      cuts.push_back(moved_model.net->size());
      std::vector<LayerRange> ranges;
      for (size_t c = 0; c < chunks; ++c) ranges.push_back({c == 0 ? 0 : cuts[c - 1], cuts[c]});
      INFO("step " << step << ": " << ranges_str(ranges));
      moved.remap(ranges);
      REQUIRE(moved.chunk_ranges() == ranges);
      // Every replica's stage s holds the chunks replica 0's does.
      for (int k = 1; k < layout.r; ++k) {
        for (int stage = 0; stage < layout.p; ++stage) {
          const auto& mine = moved.stage(k * layout.p + stage).spec().chunks;
          const auto& first = moved.stage(stage).spec().chunks;
          for (size_t l = 0; l < first.size(); ++l) {
            CHECK(mine[l]->first_index() == first[l]->first_index());
            CHECK(mine[l]->size() == first[l]->size());
          }
        }
      }
      CHECK(moved.train_step(moved_model.input, moved_model.target) ==
            plain.train_step(plain_model.input, plain_model.target));
      if (layout.shard_optimizer) check_state_held_once(moved, layout);
    }
    const auto [want_weights, want_optimizer] = plain.coordinator().fetch_state();
    const auto [got_weights, got_optimizer] = moved.coordinator().fetch_state();
    for (const auto* pair : {&want_weights, &want_optimizer}) {
      const StateDict& got = pair == &want_weights ? got_weights : got_optimizer;
      CHECK(got.size() == pair->size());
      for (const auto& [name, value] : *pair) {
        INFO(name);
        REQUIRE(got.count(name));
        CHECK(bitwise_equal(got.at(name), value));
      }
    }
    for (int k = 1; k < layout.r; ++k) {
      const StateDict replica = weights_of_replica(moved, k, layout.p);
      CHECK(replica.size() == want_weights.size());
      for (const auto& [name, value] : replica) {
        INFO("replica " << k << " " << name);
        CHECK(bitwise_equal(value, want_weights.at(name)));
      }
    }
  }
}

TEST_CASE(
    "p stages x r replicas over TCP worker processes equal the one-thread reference, bit "
    "for bit",
    "[replicas][distributed]") {
  Workers workers = start_workers(8, test_worker());
  // Every schedule and every (p, r) of the threads test once.
  for (const ReplicaLayout& layout : std::vector<ReplicaLayout>{{"1f1b", 2, 2, 1},
                                                                {"zbh1", 2, 3, 1},
                                                                {"interleaved", 2, 2, 2},
                                                                {"gpipe", 1, 2, 1},
                                                                {"1f1b", 2, 3, 1, true},
                                                                {"zbv", 1, 2, 2, true},
                                                                {"zbh2", 4, 2, 1}}) {
    check_over_tcp(layout, layout.schedule == "zbh1" ? "full" : "none", layout.schedule == "1f1b",
                   workers);
  }
}

// The whole matrix of the threads test over TCP (about a minute in Release): run it by hand,
// pipit_tests "[replicas_full]".
TEST_CASE(
    "p stages x r replicas over TCP workers: every schedule, (p, r), recomputation and "
    "ZeRO-1",
    "[.][replicas_full]") {
  Workers workers = start_workers(8, test_worker());
  for (ReplicaLayout layout : layouts()) {
    for (const std::string recompute : {"none", "full"}) {
      for (const bool shard : {false, true}) {
        layout.shard_optimizer = shard;
        check_over_tcp(layout, recompute, false, workers);
      }
    }
  }
}

TEST_CASE(
    "replicas: a run resumed from the pipeline's state equals an uninterrupted one, bit for "
    "bit, with the optimizer sharded or not",
    "[replicas]") {
  const bool shard_optimizer = GENERATE(false, true);
  INFO("sharded optimizer " << shard_optimizer);
  PipelineConfig config;
  config.stages = 2;
  config.replicas = 3;
  config.microbatches = 2;
  config.shard_optimizer = shard_optimizer;
  config.optimizer = kAdamW;
  Model whole = testing::make_gpt(kRows);
  std::vector<double> uninterrupted;
  {
    Pipeline pipeline(whole.net, config);
    for (int step = 0; step < 4; ++step) {
      uninterrupted.push_back(pipeline.train_step(whole.input, whole.target));
    }
  }
  Model first = testing::make_gpt(kRows);
  std::vector<double> resumed;
  StateDict weights, optimizer_state;
  {
    Pipeline pipeline(first.net, config);
    for (int step = 0; step < 2; ++step) {
      resumed.push_back(pipeline.train_step(first.input, first.target));
    }
    std::tie(weights, optimizer_state) = pipeline.coordinator().fetch_state();
  }
  // A fresh model from the checkpointed weights; every replica starts from them.
  Model second = testing::make_gpt(kRows);
  second.net->load_state_dict(weights);
  {
    Pipeline pipeline(second.net, config, Launch::threads(), optimizer_state);
    for (int step = 0; step < 2; ++step) {
      resumed.push_back(pipeline.train_step(second.input, second.target));
    }
  }
  CHECK(resumed == uninterrupted);
  for (const auto& [name, value] : whole.net->state_dict()) {
    INFO(name);
    CHECK(bitwise_equal(second.net->state_dict().at(name), value));
  }
}

TEST_CASE("replicas: a replica's worker that dies fails the step, naming its stage and replica",
          "[replicas][distributed]") {
  Workers workers = start_workers(4, test_worker());
  const std::vector<std::string> endpoints = testing::endpoints(workers);
  Model model = testing::make_gpt(kRows);
  PipelineConfig config;
  config.stages = 2;
  config.replicas = 2;
  config.microbatches = 2;
  config.timeout = std::chrono::milliseconds(20000);
  Pipeline pipeline(model.net, config, Launch::workers(endpoints));
  pipeline.train_step(model.input, model.target);
  workers[2]->kill();  // endpoint 2: stage 0 of replica 1
  CHECK_THROWS_WITH(pipeline.train_step(model.input, model.target),
                    Catch::Contains("stage 0 of replica 1"));
}

TEST_CASE(
    "replicas: the trace shows each stage's gradient sum on a track of its own, begun layer "
    "by layer during a chunk's last backward (B, or W under zero-bubble) and ended after the "
    "stage's last task",
    "[replicas]") {
  for (const auto& [schedule, chunks] : std::vector<std::pair<std::string, int>>{
           {"1f1b", 1}, {"zbh1", 1}, {"interleaved", 2}, {"zbv", 2}}) {
    INFO(schedule);
    Model model = testing::make_mlp(kRows);
    PipelineConfig config;
    config.stages = 2;
    config.replicas = 2;
    config.microbatches = 4;
    config.chunks_per_stage = chunks;
    config.schedule = schedule;
    config.optimizer = kAdamW;
    config.trace = true;
    Pipeline pipeline(model.net, config);
    pipeline.train_step(model.input, model.target);
    std::map<int, TraceEvent> last_task, sum;
    std::map<int, int> sums;
    for (const TraceEvent& e : pipeline.coordinator().trace().events()) {
      if (e.task.phase == Phase::GradientSum) {
        ++sums[e.task.stage];
        sum[e.task.stage] = e;
      } else if (!last_task.count(e.task.stage) || e.end_us > last_task[e.task.stage].end_us) {
        last_task[e.task.stage] = e;
      }
    }
    CHECK(sums == std::map<int, int>{{0, 1}, {1, 1}});
    for (int s = 0; s < 2; ++s) {
      INFO("stage " << s << ": last task " << last_task[s].task << " " << last_task[s].start_us
                    << " - " << last_task[s].end_us << " us, sum " << sum[s].start_us << " - "
                    << sum[s].end_us << " us");
      const bool split = schedule.rfind("zb", 0) == 0;
      CHECK(last_task[s].task.phase == (split ? Phase::WeightGrad : Phase::Backward));
      if (chunks == 1) {
        // Its last layer's gradients went before the task's other layers'.
        CHECK(sum[s].start_us > last_task[s].start_us);
      } else {
        // The chunk done first went before the stage's last task began.
        CHECK(sum[s].start_us < last_task[s].start_us);
      }
      CHECK(sum[s].start_us < last_task[s].end_us);
      CHECK(sum[s].end_us >= last_task[s].end_us);
    }
    const std::string json = pipeline.coordinator().trace().chrome_json();
    CHECK(json.find("stage 0: gradient sum") != std::string::npos);
    CHECK(json.find("stage 1: gradient sum") != std::string::npos);
  }
}
