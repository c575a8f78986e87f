// The message-kind registry: the wire values each layer declares, their names, and the rule
// that comm/ names no kind of a layer above it (issue 33: comm/ knew pipeline's and the
// parameter server's messages by name).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "comm/frame.h"
#include "pipeline/protocol/messages.h"
#include "ps/messages.h"

using namespace pipit;
namespace fs = std::filesystem;

TEST_CASE("message kinds keep their wire values and names", "[message_kinds]") {
  // A peer of another version reads these bytes: they never change.
  const std::vector<std::tuple<MessageKind, int, std::string, std::string>> expected = {
      {PipelineKind::StepBegin, 1, "StepBegin", "pipeline"},
      {PipelineKind::OptimizerStep, 2, "OptimizerStep", "pipeline"},
      {PipelineKind::Abort, 3, "Abort", "pipeline"},
      {MessageKind::Shutdown, 4, "Shutdown", "comm"},
      {PipelineKind::FetchState, 5, "FetchState", "pipeline"},
      {MessageKind::State, 6, "State", "comm"},
      {PipelineKind::Activation, 7, "Activation", "pipeline"},
      {PipelineKind::Gradient, 8, "Gradient", "pipeline"},
      {PipelineKind::StageDone, 9, "StageDone", "pipeline"},
      {PipelineKind::OptimizerDone, 10, "OptimizerDone", "pipeline"},
      {MessageKind::RoleError, 11, "RoleError", "comm"},
      {MessageKind::Hello, 12, "Hello", "comm"},
      {PipelineKind::StagePackage, 13, "StagePackage", "pipeline"},
      {MessageKind::Ready, 14, "Ready", "comm"},
      {MessageKind::Start, 15, "Start", "comm"},
      {MessageKind::Heartbeat, 16, "Heartbeat", "comm"},
      {MessageKind::PeerLost, 17, "PeerLost", "comm"},
      {PipelineKind::RemapPrepare, 18, "RemapPrepare", "pipeline"},
      {PipelineKind::LayerTransfer, 19, "LayerTransfer", "pipeline"},
      {PipelineKind::RemapReady, 20, "RemapReady", "pipeline"},
      {PipelineKind::RemapCommit, 21, "RemapCommit", "pipeline"},
      {PipelineKind::RemapDone, 22, "RemapDone", "pipeline"},
      {PsKind::Join, 23, "PsJoin", "ps"},
      {PsKind::Parameters, 24, "PsParameters", "ps"},
      {PsKind::Push, 25, "PsPush", "ps"},
      {PsKind::Leave, 26, "PsLeave", "ps"},
      {PsKind::Error, 27, "PsError", "ps"},
      {PsKind::Package, 28, "PsPackage", "ps"},
      {PipelineKind::TiedGradient, 29, "TiedGradient", "pipeline"},
      {PipelineKind::GenerateBegin, 30, "GenerateBegin", "pipeline"},
      {PipelineKind::GenerateStep, 31, "GenerateStep", "pipeline"},
      {PipelineKind::GenerateEnd, 32, "GenerateEnd", "pipeline"},
      {MessageKind::AllReduceSegment, 33, "AllReduceSegment", "comm"},
      {PipelineKind::ParameterShard, 34, "ParameterShard", "pipeline"},
      {MessageKind::PairSumDone, 35, "PairSumDone", "comm"},
  };
  const std::vector<MessageKindInfo> registered = registered_message_kinds();
  REQUIRE(registered.size() == expected.size());
  for (const auto& [kind, value, name, owner] : expected) {
    INFO(name);
    CHECK(static_cast<int>(kind) == value);
    const MessageKindInfo* info = find_message_kind(kind);
    REQUIRE(info != nullptr);
    CHECK(info->name == name);
    CHECK(info->owner == owner);
  }
  // The kinds only a coordinator or launcher sends, which stages ignore from anyone else.
  std::set<std::string> commands;
  for (const MessageKindInfo& info : registered) {
    if (info.from_coordinator_only) commands.insert(info.name);
  }
  CHECK(commands == std::set<std::string>{"StepBegin", "OptimizerStep", "Abort", "Shutdown",
                                          "FetchState", "StagePackage", "PsPackage", "Start",
                                          "RemapPrepare", "RemapCommit", "GenerateBegin",
                                          "GenerateEnd"});
  CHECK(std::string(message_kind_name(MessageKind{200})) == "unknown");
  // A frame of a kind no layer registered is refused by its number.
  std::string bytes = encode_frame(Message(MessageKind::Heartbeat, 0));
  bytes[6] = static_cast<char>(200);
  try {
    decode_frame_header(reinterpret_cast<const uint8_t*>(bytes.data()));
    FAIL("a frame of kind 200 was accepted");
  } catch (const FrameError& e) {
    CHECK(std::string(e.what()).find("unknown message kind 200") != std::string::npos);
  }
}

TEST_CASE("comm/ names no message kind of a layer above it", "[message_kinds]") {
  std::vector<std::string> upper = {"PipelineKind", "PsKind"};
  for (const MessageKindInfo& info : registered_message_kinds()) {
    if (std::string(info.owner) != "comm") upper.push_back(info.name);
  }
  std::string alternatives;
  for (const std::string& name : upper) alternatives += (alternatives.empty() ? "" : "|") + name;
  const std::regex named("\\b(" + alternatives + ")\\b");
  std::vector<std::string> found;
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(PIPIT_SOURCE_DIR "/comm")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cpp") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::smatch match;
      if (std::regex_search(line, match, named)) {
        found.push_back(entry.path().filename().string() + ":" + std::to_string(number) + " (" +
                        match[1].str() + ")");
      }
    }
  }
  CHECK(files > 20);
  std::ostringstream list;
  for (const std::string& where : found) list << "\n  comm/" << where;
  INFO(
      "comm/ must leave upper layers' kinds to them (pipeline/protocol/messages.h, "
      "ps/messages.h):"
      << list.str());
  CHECK(found.empty());
}
