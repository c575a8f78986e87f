#include "ps/messages.h"

#include <limits>

namespace pipit {
namespace {

using Fields = JsonFields<ControlError>;
constexpr int64_t kMaxVersion = std::numeric_limits<int64_t>::max() / 2;

std::vector<std::string> read_tensor_names(Fields& f, const Message& message) {
  std::vector<std::string> names = f.strings("names", kMaxControlList, kMaxControlString);
  if (names.size() != message.tensors.size()) {
    f.fail("names ", names.size(), " tensors but carries ", message.tensors.size());
  }
  return names;
}

}  // namespace

bool register_ps_message_kinds() {
  return register_message_kinds({
      {PsKind::Join, "PsJoin", "ps"},
      {PsKind::Parameters, "PsParameters", "ps"},
      {PsKind::Push, "PsPush", "ps"},
      {PsKind::Leave, "PsLeave", "ps"},
      {PsKind::Error, "PsError", "ps"},
      {PsKind::Package, "PsPackage", "ps", true},
  });
}

Message to_message(const PsParameters& p, std::vector<Tensor> tensors) {
  return control_message(PsKind::Parameters, 0, {{"version", p.version}, {"names", p.names}},
                         std::move(tensors));
}

Message to_message(const PsPush& p, std::vector<Tensor> tensors) {
  return control_message(
      PsKind::Push, 0,
      {{"version", p.version}, {"names", p.names}, {"compressed", p.compressed}, {"last", p.last}},
      std::move(tensors));
}

Message to_message(const PsError& e) {
  return control_message(PsKind::Error, 0, {{"message", e.message}}, {});
}

PsParameters read_ps_parameters(const Message& message) {
  Fields f = control_fields(message, PsKind::Parameters);
  PsParameters p;
  p.version = f.integer("version", 0, kMaxVersion);
  p.names = read_tensor_names(f, message);
  f.done();
  return p;
}

PsPush read_ps_push(const Message& message) {
  Fields f = control_fields(message, PsKind::Push);
  PsPush p;
  p.version = f.integer("version", 0, kMaxVersion);
  p.names = read_tensor_names(f, message);
  p.compressed = f.boolean("compressed");
  p.last = f.boolean("last");
  f.done();
  return p;
}

PsError read_ps_error(const Message& message) {
  Fields f = control_fields(message, PsKind::Error);
  PsError e;
  e.message = f.string("message", kMaxControlString);
  f.done();
  return e;
}

}  // namespace pipit
