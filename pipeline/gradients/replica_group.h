#pragma once
// ReplicaGroup: stage s of every replica of a pipeline (PipelineConfig::replicas, r copies of
// the pipeline, each on its own share of the batch). The group sums its gradients with
// comm/all_reduce.h in replica order (replica 0's + replica 1's + ...), so every member holds
// the same sum, the same bits, and applies the same optimizer update: the replicas' weights
// never drift apart. The sum runs in buckets: a chunk's gradients go as soon as the stage's
// last task that computes them is done, while the stage works on its other chunks; tied
// parameters last, after their exchange. Replica k's stage s is endpoint k * p + s. A group of
// two whose communicator has its own sum (Communicator::has_pair_sum: MPI_Iallreduce) sums each
// bucket with it instead: two members add a + b either way, the same bits.
//
// With the optimizer sharded (ZeRO-1, StageSpec::shard_optimizer) each member owns about 1/r of
// the stage's parameters (shard_owners), keeps the optimizer state of those alone and updates
// them alone; the group then gathers the updated parameters: each member's travel the ring of
// replicas k -> k+1 -> ... (mod r), as the sum's result does, so every link carries each
// parameter at most once. Updates are elementwise, so the bits equal an unsharded update's.
#include <optional>
#include <string>
#include <vector>

#include "comm/all_reduce.h"

namespace pipit {

inline int replica_endpoint(int replica, int stage, int stages) {
  return replica * stages + stage;
}
// How errors name an endpoint: "stage s", or with replicas "stage s of replica k".
std::string endpoint_name(int endpoint, int stages, int replicas);

class ReplicaGroup {
 public:
  // `comm`: the stage's communicator (its pair sum, where it has one), or null.
  ReplicaGroup(int stage, int stages, int replica, int replicas, Communicator* comm = nullptr);

  // Whether `endpoint` is another member of this group.
  bool member(int endpoint) const;
  // Starts step `step`'s sum of the gradients of `parameters`, flattened in this order (the
  // same on every member), none of them final yet; returns the messages to send. Segments of
  // this step that arrived before are taken now.
  AllReduce::Outgoing begin(const std::vector<Tensor>& parameters, int64_t step);
  // The first `count` parameters' gradients are final (one without a gradient counts as
  // zeros): their segments go on while the stage still computes the others (a bucket).
  AllReduce::Outgoing ready(size_t count);
  // One AllReduceSegment of the step in progress; kept until begin() when it comes first.
  AllReduce::Outgoing receive(const Message& message);
  // A bucket's pair sum is in (a PairSumDone of the step in progress).
  void pair_sum_done(const Message& message);
  // Every parameter's gradient is in the sum.
  bool all_ready() const { return begun_ && ready_count_ == parameters_.size(); }
  // The sums are the parameters' gradients now.
  bool done() const { return written_; }
  // Forgets the step in progress (an aborted step, or the next one).
  void reset();

  // ZeRO-1: the member (replica) that updates each of `parameters`: largest first, each to the
  // member with the fewest elements so far (ties: the lower replica), as torch's
  // ZeroRedundancyOptimizer partitions. Every member computes the same owners.
  static std::vector<int> shard_owners(const std::vector<Tensor>& parameters, int replicas);
  // The stage's parameters, every member's in the same order; returns who owns each
  // (shard_owners), which the group keeps for the exchange.
  const std::vector<int>& shard(std::vector<Tensor> parameters);
  // After this member updated the parameters it owns: the ParameterShard carrying them on.
  AllReduce::Outgoing share_parameters(int64_t step);
  // Another member's updated parameters (a ParameterShard of `step`): copied in, and passed
  // on round the ring unless the next member owns them. Refuses, naming it, a shard from the
  // wrong member, twice, or of the wrong count, shape or dtype.
  AllReduce::Outgoing receive_parameters(const Message& message);
  // Every other member's parameters of the step in progress have arrived.
  bool parameters_gathered() const;

 private:
  AllReduce::Outgoing take(const Message& message);
  // Once every segment is summed: the sums become the parameters' gradients.
  void write_back_when_done();

  std::vector<int> members_;
  int me_;
  Communicator* comm_;
  bool begun_ = false;
  int64_t step_ = -1;
  // Summing with the communicator's pair sum: one part per bucket.
  bool paired_ = false;
  std::vector<bool> parts_done_;
  std::vector<Tensor> parameters_;
  std::vector<int64_t> offsets_;  // parameter i's first element in flat_; then the total
  size_t ready_count_ = 0;
  Tensor flat_;
  std::optional<AllReduce> reduce_;
  std::vector<Message> pending_;
  bool written_ = false;

  int replica_;
  std::vector<Tensor> shard_parameters_;
  std::vector<int> owners_;
  int64_t gather_step_ = -1;
  std::vector<bool> gathered_;  // per replica
};

}  // namespace pipit
