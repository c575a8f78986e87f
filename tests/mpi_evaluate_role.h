#pragma once
// The validation loss over MPI ranks (tests/mpi_test.cpp runs it as
// `mpirun -np P pipit_tests --mpi-role evaluate`): Pipeline::evaluate on rank 0 equals the
// model's own forward loss, before a training step and after it (with the ranks' weights
// fetched). Prints "evaluate ok" or what differs.
#ifdef PIPIT_WITH_MPI
#include <cstdio>

#include "comm/mpi/mpi_job.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline_models.h"

namespace pipit::testing {

inline int mpi_evaluate_role() {
  PipelineConfig config;
  config.stages = mpi_job().world_size;
  config.microbatches = 2;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  Pipeline pipeline(dropout_gpt(), config, Launch::mpi());
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    return 0;
  }
  const Batch held_out = sequence_batch(4, 6, {.step = 5, .target_offset = 1});
  const Batch train = gpt_batch(11, 4, 6);
  const double before = pipeline.evaluate(held_out.input, held_out.target);
  const double expected_before = eval_mode_loss(*dropout_gpt(), held_out, 2);
  pipeline.train_step(train.input, train.target);
  const auto trained = dropout_gpt();
  trained->load_state_dict(pipeline.coordinator().fetch_state().first);
  const double after = pipeline.evaluate(held_out.input, held_out.target);
  const double expected_after = eval_mode_loss(*trained, held_out, 2);
  const bool ok = before == expected_before && after == expected_after && after != before;
  std::printf("evaluate %s (before %.9g vs %.9g, after %.9g vs %.9g)\n", ok ? "ok" : "FAILED",
              before, expected_before, after, expected_after);
  return ok ? 0 : 1;
}

}  // namespace pipit::testing
#endif
