#pragma once
// TensorBoard event files, written by hand: no TensorFlow, no protobuf library. A file is a
// sequence of TFRecords (length, masked CRC-32C of the length, the bytes, their masked
// CRC-32C), each holding one serialized `Event` protocol buffer: first one naming the format
// ("brain.Event:2") and the writer, then one per scalar, a `Summary` with one `Value{tag,
// simple_value}`. That is what torch.utils.tensorboard's add_scalar writes, and what tensorboard
// and its EventAccumulator read as scalars. tests/data/tensorboard holds a file the tensorboard
// package wrote for the same scalars; ours matches it byte for byte (but for the writer's
// name).
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace pipit {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it,
  // events.out.tfevents.<seconds>.<host>.<pid>.<n> (tensorboard reads every such file in the
  // directory), and writes its version event. Errors name the path.
  explicit TensorBoardWriter(const std::string& dir);
  // One scalar at `step`, stamped `wall_time` seconds since the epoch (default: now).
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  // Hands what was written to the operating system, so a reader sees it while training runs.
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream file_;
};

namespace tensorboard {
// The pieces, for tests and for writers of other streams.
uint32_t masked_crc32c(std::string_view bytes);
std::string record(std::string_view event);  // one TFRecord around a serialized event
// The first event: the format's version, and the writer's name (tensorboard's own writer
// says "tensorboard.summary.writer.event_file_writer"; pipit's says "pipit").
std::string version_event(double wall_time, std::string_view writer);
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);
}  // namespace tensorboard

}  // namespace pipit
