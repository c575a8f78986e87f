#pragma once
// StageHost: where a Pipeline's stages run (pipeline/launch.h), behind one interface: threads
// of this process (thread_stages.h), worker processes over TCP (remote/worker_stages.h) or
// MPI ranks (remote/mpi/mpi_stages.h). A host starts the stages and hands the Pipeline the
// communicator its Coordinator drives them through.
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "pipeline/stage.h"
#include "tensor/error.h"

namespace pipit {

class Coordinator;

class StageHost {
 public:
  virtual ~StageHost() = default;
  // The coordinator's endpoint; null in a process that does not coordinate (MPI ranks but 0).
  virtual std::shared_ptr<Communicator> coordinator_endpoint() = 0;
  // Once the Coordinator exists (threads: layers a remap moved go back into the model).
  virtual void coordinate(Coordinator&) {}
  // The stages that run in this process.
  virtual std::vector<Stage*> stages() { return {}; }
  // A process that does not coordinate: serves its stages until the coordinator is done.
  virtual void serve() { throw Error("Pipeline: only MPI ranks other than 0 serve()"); }
  // After the coordinator shut the stages down: waits for them, closes the transport.
  virtual void stop() {}
  // This process's rank in an MPI job and the job's size; 0 and 1 elsewhere.
  virtual int rank() const { return 0; }
  virtual int world_size() const { return 1; }
  // How many of this process's gradient sums the transport made itself (MPI_Iallreduce pairs,
  // MpiOptions::pair_replicas); 0 elsewhere.
  virtual int64_t pair_sums() const { return 0; }
};

}  // namespace pipit
