#pragma once
// PipelineConfig: how a model is cut and trained as a pipeline.
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeline/rebalancing/rebalance.h"

namespace pipit {

struct PipelineConfig {
  int stages = 2;            // p
  int microbatches = 4;      // m: each batch splits into m equal parts along dim 0
  int chunks_per_stage = 1;  // v: > 1 interleaves model chunks over the stages
  // r: copies of the pipeline trained side by side (data parallelism across pipelines). Each
  // step's batch splits into r * m microbatches, replica k taking microbatches k*m .. k*m+m-1;
  // stage s of every replica sums its gradients with the others'
  // (pipeline/gradients/replica_group.h), so all replicas apply the same update. Replica k's stage
  // s is endpoint k * p + s.
  int replicas = 1;
  // ZeRO-1 with replicas: stage s of each replica keeps the optimizer state of about 1/r of the
  // stage's parameters and updates those alone, then the replicas gather the updated
  // parameters (pipeline/gradients/replica_group.h). The same bits as without it, 1/r of the state.
  bool shard_optimizer = false;
  // Under MPI (Launch::mpi()) with replicas, which rank runs which endpoint: "stages" (rank
  // s * r + k runs stage s of replica k: a stage's replicas on neighbouring ranks, so when
  // ranks fill nodes in order the gradient sums stay inside a node and only activations cross
  // between nodes, as Megatron-LM places data parallelism inside pipeline parallelism) or
  // "pipelines" (rank k * p + s: each replica's stages on neighbouring ranks).
  std::string rank_layout = "stages";
  // "gpipe", "1f1b", "interleaved", "zbh1", "zbh2", or "table": run `schedule_table`, one
  // line of tasks per stage (pipeline/schedules/schedule.h, parse_schedule_table).
  std::string schedule = "1f1b";
  std::string schedule_table = "";
  std::string partition = "uniform";  // "uniform" (layer count) or "parameters"
  // Activation recomputation: "none", or "full": a stage keeps only each chunk's input per
  // microbatch and runs the chunk's forward again just before its backward (B or I), drawing
  // the same dropout masks, so results are bit-for-bit those of "none".
  std::string recompute = "none";
  // Zero-bubble schedules: at most this many weight-gradient tasks (W) waiting per stage, 0: the
  // schedule's own (p for zbh1 and zbv, 2p for zbh2). Fewer hold less memory (a deferred W
  // keeps its matmuls' inputs) for a longer bubble.
  int max_deferred = 0;
  // An explicit partition: layers per chunk in model order (p * v entries, each >= 1, adding
  // up to the model's layers). When given, `partition` is not used.
  std::vector<int64_t> layer_counts = {};
  nlohmann::json loss = {{"type", "CrossEntropyLoss"}};
  nlohmann::json optimizer = {{"type", "AdamW"}, {"lr", 1e-3}};
  double max_grad_norm = 0;  // > 0: clip the global gradient norm across all stages
  // A step fails when no stage has said anything for this long.
  std::chrono::milliseconds timeout{30000};
  bool trace = false;  // record every task's start and end
  // Stage s runs on devices[s % devices.size()] ("cpu", "cuda", "cuda:1"); empty: the CPU.
  // The model's parameters move to their stage's device.
  std::vector<std::string> devices = {};
  // "f32"; "bf16" or "f16": mixed precision (autograd/autocast.h) with f32 master weights,
  // and for f16 dynamic loss scaling by the coordinator.
  std::string dtype = "f32";
  // Per stage (stage s: slowdown[s % size]), >= 1: stretches every layer of that stage to this
  // many times its duration, as on a slower machine (tests and benchmarks of rebalancing on
  // one computer). Empty: no stage is slowed. Worker processes take theirs from
  // pipit-worker --slowdown instead.
  std::vector<double> slowdown = {};
  // Every this many training steps, stages time each layer (StepStats::layers); 0: never.
  // Profiling runs a chunk layer by layer with a hook per layer, which costs little.
  int profile_every = 0;
  // Automatic rebalancing (pipeline/rebalancing/rebalance.h; v = 1): moves layers between stages
  // when the measured layer times say a partition with a faster slowest stage pays off. Stages are
  // profiled every profile_every steps, or every step when that is 0.
  RebalanceConfig rebalance = {};
};

// The most tasks (a forward and a backward per microbatch, chunk and stage) a configuration
// may schedule: the schedule of every stage is built, so p * m * v is bounded before that
// (and products of them index chunks and microbatches as int).
constexpr int64_t kMaxScheduleTasks = int64_t{1} << 24;
// Far more replicas than any run has machines, few enough that p * r endpoints are ints.
constexpr int kMaxReplicas = 1 << 16;

// Throws an Error naming the first invalid field (p, m, v < 1, unknown schedule or partition,
// more than kMaxScheduleTasks tasks, a schedule that cannot run with these p, m, v).
void validate(const PipelineConfig& config);

}  // namespace pipit
