// Validation through a pipeline: Pipeline::evaluate runs the same stages forward only, in eval
// mode, and changes nothing a later training step sees.
#include <catch2/catch.hpp>

#include "distributed_reference.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipit.h"

using namespace pipit;
using namespace pipit::testing;

namespace {

PipelineConfig two_stages() {
  PipelineConfig config;
  config.stages = 2;
  config.microbatches = 2;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  return config;
}

}  // namespace

TEST_CASE("a pipeline's validation loss is the model's own forward loss, and trains nothing",
          "[pipeline][evaluate]") {
  const Batch held_out = sequence_batch(4, 6, {.step = 5, .target_offset = 1});
  const Batch train = gpt_batch(11, 4, 6);
  const double expected = eval_mode_loss(*dropout_gpt(), held_out, 2);

  Pipeline pipeline(dropout_gpt(), two_stages());
  CHECK(pipeline.evaluate(held_out.input, held_out.target) == expected);
  CHECK(pipeline.evaluate(held_out.input, held_out.target) == expected);  // no update between
  // A step after evaluating is the step a pipeline that never evaluated takes: same loss, and
  // the dropout streams were not drawn from.
  Pipeline fresh(dropout_gpt(), two_stages());
  CHECK(pipeline.train_step(train.input, train.target) ==
        fresh.train_step(train.input, train.target));
  CHECK(pipeline.evaluate(held_out.input, held_out.target) ==
        fresh.evaluate(held_out.input, held_out.target));
  CHECK(pipeline.evaluate(held_out.input, held_out.target) != expected);  // it did train
}

TEST_CASE("the validation loss over worker processes is the model's own forward loss",
          "[pipeline][evaluate][distributed]") {
  const Batch held_out = sequence_batch(4, 6, {.step = 5, .target_offset = 1});
  const Batch train = gpt_batch(11, 4, 6);
  Workers workers = start_workers(2, test_worker());
  Pipeline remote(dropout_gpt(), two_stages(), Launch::workers(endpoints(workers)));
  INFO(logs(workers));
  CHECK(remote.evaluate(held_out.input, held_out.target) ==
        eval_mode_loss(*dropout_gpt(), held_out, 2));
  remote.train_step(train.input, train.target);
  // The workers' weights after the step, in a model of this process.
  const auto trained = dropout_gpt();
  trained->load_state_dict(remote.coordinator().fetch_state().first);
  const double expected = eval_mode_loss(*trained, held_out, 2);
  CHECK(remote.evaluate(held_out.input, held_out.target) == expected);
  CHECK(expected != eval_mode_loss(*dropout_gpt(), held_out, 2));
}
