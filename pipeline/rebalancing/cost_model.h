#pragma once
// What a partition costs, predicted from per-layer measurements taken under another one.
// A layer's time is the work of its kind times the speed of the stage that runs it, so the
// time a slow stage measured for a layer says what that layer would cost on a faster one.
// Units: times in ms per microbatch (forward + backward), sizes in bytes, 1 MB = 1e6 bytes.
#include <cstddef>
#include <string>
#include <vector>

#include "pipeline/partition.h"

namespace pipit {

// One step's measurements, or a window's per-layer medians; index = global layer.
struct LayerCosts {
  std::vector<double> ms;            // time on the stage that owns the layer now
  std::vector<double> output_bytes;  // its output activation: what a cut after it sends
  std::vector<double> state_bytes;   // weights + optimizer state: what moving it sends
  // Per microbatch, what the last stage waits for between its forward and its backward: the
  // coordinator's loss and loss gradient, and over a wire the output's and the gradient's
  // transfers. In 1F1B the last stage has nothing else to do meanwhile, so it counts as that
  // stage's time (under GPipe it overlaps later forwards: the model overestimates there).
  double loss_ms = 0;
};

class CostModel {
 public:
  // layer_work: ms of each layer on a speed-1 stage; stage_speed: the factor a stage's
  // layer times carry; output_bytes and loss_ms as in LayerCosts; link: ms to send 1 MB to a
  // neighbour.
  CostModel(std::vector<double> layer_work, std::vector<double> stage_speed,
            std::vector<double> output_bytes, double link_ms_per_mb, double loss_ms = 0);

  // Least squares in log space, log ms(l) = log work(kind(l)) + log speed(stage(l)), over
  // times measured under `ranges` (chunk c on stage c % stages); layers with the same kind
  // string cost the same on the same stage. Speeds are relative: their geometric mean is 1
  // within each group of stages linked by shared kinds, so a stage sharing no kind with
  // another has speed 1. A time of 0 says nothing about a ratio and is left out of the fit;
  // a kind measured only as 0 has work 0.
  static CostModel fit(const std::vector<std::string>& layer_kinds,
                       const std::vector<LayerRange>& ranges, int stages,
                       const LayerCosts& measured, double link_ms_per_mb);

  // `stage` running layers [range.begin, range.end): speed x work, plus what the stage sends
  // (each stage pays for its sends, not its receives): the activation out of the range's last
  // layer forward, and the gradient into its first layer backward, the size of the
  // activation that came in. The range holding the last layer also waits for the loss
  // (loss_ms). Nothing crosses a link when there is one stage.
  double chunk_ms(int stage, LayerRange range) const;
  // Per stage, the sum over its chunks.
  std::vector<double> stage_ms(const std::vector<LayerRange>& ranges) const;
  double slowest_stage_ms(const std::vector<LayerRange>& ranges) const;

  size_t layers() const { return layer_work_.size(); }
  int stages() const { return static_cast<int>(stage_speed_.size()); }
  const std::vector<double>& layer_work() const { return layer_work_; }
  const std::vector<double>& stage_speed() const { return stage_speed_; }

 private:
  std::vector<double> layer_work_;
  std::vector<double> stage_speed_;
  std::vector<double> output_bytes_;
  double link_ms_per_mb_;
  double loss_ms_;
  std::vector<double> work_before_;  // [i]: total work of layers [0, i)
};

// A step of m microbatches takes m + (p - 1) / v slowest-stage times: GPipe and 1F1B
// (v = 1) fill and drain p - 1 of them; interleaving v chunks shortens those by v.
double predict_step_ms(const CostModel& model, const std::vector<LayerRange>& ranges,
                       int microbatches);

// What going from partition `from` to `to` sends, given each layer's state_bytes.
struct Migration {
  double bytes = 0;       // the state of the layers that change stage, each counted once
  double link_bytes = 0;  // the state of the layers that change chunk, times the links each
                          // crosses: layers are relayed chunk to chunk (LayerMigration)
  double ms = 0;          // link_bytes at link_ms_per_mb, one link after another
};
Migration estimate_migration(const std::vector<LayerRange>& from, const std::vector<LayerRange>& to,
                             int stages, const std::vector<double>& state_bytes,
                             double link_ms_per_mb);

// Throw an Error starting with `caller` and naming what is wrong: a range count other than
// `chunks`, a chunk that is empty or does not start where the one before ended, ranges that
// do not cover exactly `layers`; sizes other than `layers`, or values that are negative or
// not finite (`what` names the values).
void check_partition(const char* caller, const std::vector<LayerRange>& ranges, size_t layers,
                     size_t chunks);
void check_layer_values(const char* caller, const char* what, const std::vector<double>& values,
                        size_t layers);
void check_layer_costs(const char* caller, const LayerCosts& costs, size_t layers);

}  // namespace pipit
