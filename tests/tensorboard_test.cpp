// pipit's TensorBoard event writer against a file the tensorboard package wrote
// (tests/make_tensorboard_reference.py): the same bytes for the same scalars.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "codec/tensorboard_events.h"

using namespace pipit;
namespace fs = std::filesystem;

namespace {

struct Scalar {
  const char* tag;
  float value;
  int64_t step;
  double wall_time;
};

// As in make_tensorboard_reference.py.
constexpr double kVersionTime = 1764331200.25;
const Scalar kScalars[] = {{"loss/train", 4.1743f, 0, 1764331201.5},
                           {"loss/train", 3.25f, 1, 1764331202.0},
                           {"loss/val", 3.5f, 1, 1764331202.125},
                           {"lr", 0.0f, 2, 1764331203.0},
                           {"tokens_per_s", 123456.78f, 300, 1764331204.75},
                           {"grad_norm", -0.5f, int64_t{1} << 40, 1764331205.0}};

// The records of an event file, each checked against its two masked CRCs.
std::vector<std::string> records(const std::string& bytes) {
  std::vector<std::string> events;
  for (size_t at = 0; at < bytes.size();) {
    REQUIRE(at + 12 <= bytes.size());
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    REQUIRE(length_crc == tensorboard::masked_crc32c(bytes.substr(at, 8)));
    REQUIRE(at + 16 + length <= bytes.size());
    events.push_back(bytes.substr(at + 12, length));
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    REQUIRE(data_crc == tensorboard::masked_crc32c(events.back()));
    at += 16 + length;
  }
  return events;
}

}  // namespace

TEST_CASE("TensorBoard events are the bytes the tensorboard package writes", "[tensorboard]") {
  const std::string reference = read_file(PIPIT_TEST_DATA "/tensorboard/scalars.tfevents");
  std::string ours = tensorboard::record(
      tensorboard::version_event(kVersionTime, "tensorboard.summary.writer.event_file_writer"));
  for (const Scalar& s : kScalars) {
    ours += tensorboard::record(tensorboard::scalar_event(s.tag, s.value, s.step, s.wall_time));
  }
  CHECK(ours.size() == reference.size());
  CHECK(ours == reference);
  CHECK(records(reference).size() == 1 + std::size(kScalars));
}

TEST_CASE("TensorBoardWriter writes a version event, then one event per scalar", "[tensorboard]") {
  const fs::path dir =
      fs::temp_directory_path() / ("pipit_tensorboard_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter writer((dir / "run").string());
    for (const Scalar& s : kScalars) writer.add_scalar(s.tag, s.value, s.step, s.wall_time);
    writer.flush();
    path = writer.path();
  }
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::vector<std::string> events = records(read_file(path));
  REQUIRE(events.size() == 1 + std::size(kScalars));
  CHECK(events[0].find("brain.Event:2") != std::string::npos);
  CHECK(events[0].find("pipit") != std::string::npos);
  for (size_t i = 0; i < std::size(kScalars); ++i) {
    const Scalar& s = kScalars[i];
    CHECK(events[i + 1] == tensorboard::scalar_event(s.tag, s.value, s.step, s.wall_time));
  }
  fs::remove_all(dir);
  CHECK_THROWS_WITH(TensorBoardWriter("/proc/pipit_no_such_dir/run"),
                    Catch::Contains("/proc/pipit_no_such_dir/run"));
}
