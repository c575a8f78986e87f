// A run's progress, printed and recorded: the metrics file's lines hold the numbers the printed
// lines show (at full precision), and the event file holds the same scalars.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "distributed_reference.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline.h"
#include "train/gpu_peak.h"
#include "train/metrics_log.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;

TEST_CASE("the metrics file's lines are the printed progress lines' numbers", "[metrics]") {
  const fs::path dir = fs::temp_directory_path() / ("pipit_metrics_" + std::to_string(getpid()));
  fs::remove_all(dir);
  PipelineConfig config;
  config.stages = 2;
  config.microbatches = 2;
  config.max_grad_norm = 1.0;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  Pipeline pipeline(small_gpt(2), config);
  const Batch train = gpt_batch(11, 4, 6);
  const Batch held_out = sequence_batch(4, 6, {.step = 5, .target_offset = 1});
  CosineSchedule schedule(0.01, 0.001, 1, 4);
  std::vector<std::string> printed;
  std::vector<double> losses, val_losses;
  {
    MetricsLog log((dir / "metrics.jsonl").string(), (dir / "board").string());
    for (int64_t step = 0; step < 4; ++step) {
      pipeline.coordinator().set_lr(schedule.lr(step));
      Progress progress;
      progress.step = step + 1;
      progress.train_loss = pipeline.train_step(train.input, train.target);
      progress.lr = schedule.lr(step);
      progress.grad_norm = pipeline.coordinator().last_step().grad_norm;
      progress.tokens_per_s = 1000.0 / 3 * static_cast<double>(step + 1);
      if (step % 2 == 1) progress.val_loss = pipeline.evaluate(held_out.input, held_out.target);
      if (step == 3) progress.mfu = 0.4125;
      progress.peak_memory_bytes = int64_t{3} << 29;
      progress.elapsed_s = 0.25 * static_cast<double>(step + 1);
      losses.push_back(progress.train_loss);
      if (progress.val_loss) val_losses.push_back(*progress.val_loss);
      printed.push_back(log.record(progress));
    }
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::string text;
  size_t lines = 0, with_val = 0;
  while (std::getline(in, text)) {
    REQUIRE(lines < printed.size());
    const Progress read = progress_from_json(nlohmann::json::parse(text));
    INFO(text);
    CHECK(progress_line(read) == printed[lines]);
    CHECK(read.train_loss == losses[lines]);  // bit for bit through the JSON
    if (read.val_loss) CHECK(*read.val_loss == val_losses[with_val++]);
    ++lines;
  }
  CHECK(lines == 4);
  CHECK(with_val == 2);
  CHECK(printed[3].find("  val ") != std::string::npos);
  CHECK(printed[3].find("mfu 41.2%") != std::string::npos);
  CHECK(printed[0].find("peak 1.50 GiB") != std::string::npos);
  // loss, lr, grad_norm, tokens/s and peak memory at every step, val twice, mfu once; and the
  // version event.
  const auto board = *fs::directory_iterator(dir / "board");
  const std::string events = read_file(board.path().string());
  CHECK(events.find("loss/val") != std::string::npos);
  size_t records = 0;
  for (size_t at = 0; at + 8 <= events.size(); ++records) {
    uint64_t length = 0;
    std::memcpy(&length, events.data() + at, 8);
    at += 16 + length;
  }
  CHECK(records == 1 + 4 * 5 + 2 + 1);
  fs::remove_all(dir);
}

TEST_CASE("a metrics line missing a field, or a path that cannot be written, is named",
          "[metrics]") {
  CHECK_THROWS_WITH(progress_from_json({{"step", 1}, {"lr", 0.1}}),
                    Catch::Contains("\"train_loss\""));
  CHECK_THROWS_WITH(
      progress_from_json(
          {{"step", 1}, {"train_loss", "x"}, {"lr", 0.1}, {"tokens_per_s", 1}, {"elapsed_s", 1}}),
      Catch::Contains("\"train_loss\" must be a number"));
  CHECK_THROWS_WITH(MetricsLog("/proc/pipit_no_dir/metrics.jsonl", ""),
                    Catch::Contains("/proc/pipit_no_dir/metrics.jsonl"));
}

TEST_CASE("GPUs known by name have their datasheet's dense peak", "[metrics]") {
  CHECK(dense_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12);
  CHECK(dense_peak_flops("NVIDIA H200", "f16") == 989e12);
  CHECK(dense_peak_flops("NVIDIA H200", "f32") == 494e12);  // TF32
  CHECK(dense_peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12);
  CHECK_FALSE(dense_peak_flops("NVIDIA GeForce GTX 1080", "bf16").has_value());
  if (cuda_device_count() == 0) CHECK_FALSE(cuda_dense_peak_flops(0, "bf16").has_value());
}
