#pragma once
// Parameter-server training under mpirun or srun (SPMD): every rank runs the same program
// and calls train_ps_over_mpi with the same model (same config and seed) and PsConfig. Ranks
// 0 .. servers-1 serve the shards, ranks servers .. servers+workers-1 train as workers, so
// the job has servers + workers ranks. Each worker rank draws its own batches from
// options.batch: nothing is shipped. At start-up the ranks compare the model and the
// PsConfig; ranks that differ from rank 0 are named and every rank throws.
//   mpirun -np 6 build/train_ps --launcher mpi --servers 2 --workers 4
#include "comm/mpi/mpi_communicator.h"
#include "nn/module.h"
#include "ps/run.h"

namespace pipit {

// This rank's part in a run of `config`: a shard or a worker, by the rank's index.
struct MpiPsRole {
  bool server = false;
  int index = 0;  // the shard's or the worker's
};
MpiPsRole mpi_ps_role(const PsConfig& config, int rank);

// Returns on every rank once every worker has left, with the part of the report this rank
// owns: a shard's weights and its entry in `servers`, or a worker's entries in `workers` and
// `losses` (every other entry stays empty; `seconds` is this rank's). options.on_step runs
// on the worker ranks.
PsRunReport train_ps_over_mpi(const Module& model, const PsConfig& config,
                              const PsRunOptions& options, MpiOptions mpi = {});

}  // namespace pipit
