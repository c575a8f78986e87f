#pragma once
// What a training run reports every few steps, printed and recorded alike: one JSON line per
// progress line (--metrics FILE, for plotting or pipit-report) and TensorBoard scalars
// (--tensorboard DIR). The printed line and the records come from the same Progress, so they
// cannot disagree.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "codec/tensorboard_events.h"

namespace pipit {

struct Progress {
  int64_t step = 0;  // optimizer steps done
  double train_loss = 0;
  std::optional<double> val_loss;  // on the steps that evaluated
  double lr = 0;
  std::optional<double> grad_norm;  // before clipping, when clipping
  double tokens_per_s = 0;
  std::optional<double> mfu;  // model FLOP/s over the peak, when the peak is known (0..1)
  std::optional<int64_t> peak_memory_bytes;
  double elapsed_s = 0;
};

// "step    10  loss 2.5412  val 2.6010  lr 3.00e-03  norm 0.812  tokens/s 12345  mfu 41.2%
// peak 1.2 GiB  elapsed 3.4s", the optional parts only when known.
std::string progress_line(const Progress& progress);
// {"step": 10, "train_loss": 2.5412..., ...}, full precision, the unknown fields left out.
nlohmann::json progress_json(const Progress& progress);
// The inverse, for readers of the metrics file (pipit-report); errors name the field.
Progress progress_from_json(const nlohmann::json& line);

class MetricsLog {
 public:
  // Either may be empty: no JSON lines, no event file. Missing directories are made; errors
  // name the path.
  MetricsLog(const std::string& jsonl_path, const std::string& tensorboard_dir);
  ~MetricsLog();
  // Appends `progress` to both (flushed, so a plot of a running job is current) and returns
  // its progress_line().
  std::string record(const Progress& progress);

 private:
  struct Files;
  std::unique_ptr<Files> files_;
};

}  // namespace pipit
