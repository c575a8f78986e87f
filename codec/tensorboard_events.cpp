#include "codec/tensorboard_events.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "codec/crc32c.h"
#include "tensor/error.h"

namespace pipit {
namespace tensorboard {
namespace {

// Protocol buffer wire format: a field's key is its number shifted left by 3 plus its wire
// type (0: varint, 1: 64-bit, 2: length-delimited, 5: 32-bit); integers are little-endian.
void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

template <typename T>
void little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // pipit runs on little-endian machines only
  out.append(bytes, sizeof(T));
}

void bytes_field(std::string& out, int field, std::string_view bytes) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out.append(bytes);
}

// Event's wall_time (field 1) and step (field 2). Proto3 leaves out fields at their default
// value, and so must we to write the same bytes.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  if (wall_time != 0) {
    event += '\x09';
    little_endian(event, wall_time);
  }
  if (step != 0) {
    event += '\x10';
    varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

}  // namespace

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string record(std::string_view event) {
  std::string length;
  little_endian(length, static_cast<uint64_t>(event.size()));
  std::string out = length;
  little_endian(out, masked_crc32c(length));
  out.append(event);
  little_endian(out, masked_crc32c(event));
  return out;
}

std::string version_event(double wall_time, std::string_view writer) {
  std::string event = event_header(wall_time, 0);
  bytes_field(event, 3, "brain.Event:2");
  std::string source;  // SourceMetadata{writer}, field 10
  bytes_field(source, 1, writer);
  bytes_field(event, 10, source);
  return event;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string summary_value;
  bytes_field(summary_value, 1, tag);
  summary_value += '\x15';  // simple_value: field 2, 32-bit; in a oneof, so written even if 0
  little_endian(summary_value, value);
  std::string summary;
  bytes_field(summary, 1, summary_value);
  std::string event = event_header(wall_time, step);
  bytes_field(event, 5, summary);
  return event;
}

}  // namespace tensorboard

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  PIPIT_CHECK(!error, "tensorboard: cannot create directory '", dir, "': ", error.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // Two writers in one process within a second still get files of their own.
  static std::atomic<int> made{0};
  const double now = seconds_now();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host +
          "." + std::to_string(getpid()) + "." + std::to_string(made++);
  file_.open(path_, std::ios::binary | std::ios::trunc);
  PIPIT_CHECK(file_.good(), "tensorboard: cannot write '", path_, "'");
  file_ << tensorboard::record(tensorboard::version_event(now, "pipit"));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step,
                                   double wall_time) {
  const double stamp = wall_time < 0 ? seconds_now() : wall_time;
  file_ << tensorboard::record(
      tensorboard::scalar_event(tag, static_cast<float>(value), step, stamp));
  PIPIT_CHECK(file_.good(), "tensorboard: cannot write '", path_, "'");
}

void TensorBoardWriter::flush() {
  file_.flush();
  PIPIT_CHECK(file_.good(), "tensorboard: cannot write '", path_, "'");
}

}  // namespace pipit
