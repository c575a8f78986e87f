#include "train/metrics_log.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tensor/error.h"

namespace pipit {
namespace {

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

template <typename T>
std::optional<T> optional_field(const nlohmann::json& line, const char* name) {
  if (!line.contains(name)) return std::nullopt;
  PIPIT_CHECK(line[name].is_number(), "metrics: field \"", name, "\" must be a number, got ",
              line[name].dump());
  return line[name].get<T>();
}

}  // namespace

std::string progress_line(const Progress& p) {
  std::string line = "step " + format("%5.0f", static_cast<double>(p.step)) + "  loss " +
                     format("%.4f", p.train_loss);
  if (p.val_loss) line += "  val " + format("%.4f", *p.val_loss);
  line += "  lr " + format("%.2e", p.lr);
  if (p.grad_norm) line += "  norm " + format("%.3f", *p.grad_norm);
  line += "  tokens/s " + format("%9.0f", p.tokens_per_s);
  if (p.mfu) line += "  mfu " + format("%.1f%%", *p.mfu * 100);
  if (p.peak_memory_bytes) {
    line += "  peak " + format("%.2f GiB", static_cast<double>(*p.peak_memory_bytes) / (1 << 30));
  }
  return line + "  elapsed " + format("%.1fs", p.elapsed_s);
}

nlohmann::json progress_json(const Progress& p) {
  nlohmann::json line = {{"step", p.step},
                         {"train_loss", p.train_loss},
                         {"lr", p.lr},
                         {"tokens_per_s", p.tokens_per_s},
                         {"elapsed_s", p.elapsed_s}};
  if (p.val_loss) line["val_loss"] = *p.val_loss;
  if (p.grad_norm) line["grad_norm"] = *p.grad_norm;
  if (p.mfu) line["mfu"] = *p.mfu;
  if (p.peak_memory_bytes) line["peak_memory_bytes"] = *p.peak_memory_bytes;
  return line;
}

Progress progress_from_json(const nlohmann::json& line) {
  PIPIT_CHECK(line.is_object(), "metrics: a line must be a JSON object, got ", line.dump());
  Progress p;
  for (const char* required : {"step", "train_loss", "lr", "tokens_per_s", "elapsed_s"}) {
    PIPIT_CHECK(line.contains(required), "metrics: line has no \"", required, "\": ", line.dump());
  }
  p.step = *optional_field<int64_t>(line, "step");
  p.train_loss = *optional_field<double>(line, "train_loss");
  p.lr = *optional_field<double>(line, "lr");
  p.tokens_per_s = *optional_field<double>(line, "tokens_per_s");
  p.elapsed_s = *optional_field<double>(line, "elapsed_s");
  p.val_loss = optional_field<double>(line, "val_loss");
  p.grad_norm = optional_field<double>(line, "grad_norm");
  p.mfu = optional_field<double>(line, "mfu");
  p.peak_memory_bytes = optional_field<int64_t>(line, "peak_memory_bytes");
  return p;
}

struct MetricsLog::Files {
  std::string jsonl_path;
  std::ofstream jsonl;
  std::optional<TensorBoardWriter> tensorboard;
};

MetricsLog::MetricsLog(const std::string& jsonl_path, const std::string& tensorboard_dir)
    : files_(std::make_unique<Files>()) {
  if (!jsonl_path.empty()) {
    files_->jsonl_path = jsonl_path;
    std::error_code error;  // a directory it cannot make shows as the file it cannot open
    std::filesystem::create_directories(std::filesystem::path(jsonl_path).parent_path(), error);
    files_->jsonl.open(jsonl_path, std::ios::trunc);
    PIPIT_CHECK(files_->jsonl.good(), "metrics: cannot write '", jsonl_path, "'");
  }
  if (!tensorboard_dir.empty()) files_->tensorboard.emplace(tensorboard_dir);
}

MetricsLog::~MetricsLog() = default;

std::string MetricsLog::record(const Progress& p) {
  if (files_->jsonl.is_open()) {
    files_->jsonl << progress_json(p).dump() << '\n' << std::flush;
    PIPIT_CHECK(files_->jsonl.good(), "metrics: cannot write '", files_->jsonl_path, "'");
  }
  if (auto& board = files_->tensorboard) {
    board->add_scalar("loss/train", p.train_loss, p.step);
    if (p.val_loss) board->add_scalar("loss/val", *p.val_loss, p.step);
    board->add_scalar("lr", p.lr, p.step);
    if (p.grad_norm) board->add_scalar("grad_norm", *p.grad_norm, p.step);
    board->add_scalar("tokens_per_s", p.tokens_per_s, p.step);
    if (p.mfu) board->add_scalar("mfu", *p.mfu, p.step);
    if (p.peak_memory_bytes) {
      board->add_scalar("peak_memory_gib", static_cast<double>(*p.peak_memory_bytes) / (1 << 30),
                        p.step);
    }
    board->flush();
  }
  return progress_line(p);
}

}  // namespace pipit
