#include "pipeline/protocol/generate_messages.h"

#include "comm/json_fields.h"
#include "pipeline/protocol/messages.h"

namespace pipit {
namespace {

// Far above any real batch or context, low enough that the caches' sizes cannot overflow.
constexpr int64_t kMaxRows = 1 << 20;
constexpr int64_t kMaxPositions = 1 << 24;

}  // namespace

Message to_message(const GenerateBegin& begin, int64_t step) {
  Message message(PipelineKind::GenerateBegin, step);
  message.meta = {{"batch", begin.batch}, {"capacity", begin.capacity}, {"padding", begin.padding}};
  return message;
}

GenerateBegin read_generate_begin(const Message& message) {
  PIPIT_CHECK(message.kind == PipelineKind::GenerateBegin, "expected a GenerateBegin message, got ",
              message_kind_name(message.kind));
  JsonFields<ControlError> f(message.meta, "GenerateBegin message");
  GenerateBegin begin;
  begin.batch = f.integer("batch", 1, kMaxRows);
  begin.capacity = f.integer("capacity", 1, kMaxPositions);
  const nlohmann::json& padding = f.array("padding", static_cast<size_t>(begin.batch));
  PIPIT_CHECK(padding.size() == static_cast<size_t>(begin.batch),
              "GenerateBegin message: ", padding.size(), " paddings for ", begin.batch, " rows");
  for (const nlohmann::json& pad : padding) {
    PIPIT_CHECK(
        pad.is_number_integer() && pad.get<int64_t>() >= 0 && pad.get<int64_t>() < begin.capacity,
        "GenerateBegin message: padding ", pad.dump(), " is not in [0, capacity ", begin.capacity,
        ")");
    begin.padding.push_back(pad.get<int64_t>());
  }
  f.done();
  return begin;
}

int64_t read_generate_start(const Message& message) {
  JsonFields<ControlError> f(message.meta, "GenerateStep message");
  const int64_t start = f.integer("start", 0, kMaxPositions);
  f.done();
  return start;
}

}  // namespace pipit
