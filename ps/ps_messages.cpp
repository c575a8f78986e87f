#include "ps/ps_messages.h"

#include <limits>

#include "comm/json_fields.h"

namespace pipit {
namespace {

using Fields = JsonFields<ControlError>;
constexpr int64_t kMaxVersion = std::numeric_limits<int64_t>::max() / 2;

Fields fields_of(const Message& message, MessageKind kind) {
  if (message.kind != kind) {
    throw ControlError(detail::concat("expected a ", message_kind_name(kind), " message, got ",
                                      message_kind_name(message.kind)));
  }
  return Fields(message.meta, std::string(message_kind_name(kind)) + " message");
}

std::vector<std::string> read_tensor_names(Fields& f, const Message& message) {
  std::vector<std::string> names = f.strings("names", kMaxControlList, kMaxControlString);
  if (names.size() != message.tensors.size()) {
    f.fail("names ", names.size(), " tensors but carries ", message.tensors.size());
  }
  return names;
}

Message with_meta(MessageKind kind, nlohmann::json meta, std::vector<Tensor> tensors) {
  Message message(kind, 0, 0, 0, std::move(tensors));
  message.meta = std::move(meta);
  return message;
}

}  // namespace

Message to_message(const PsParameters& p, std::vector<Tensor> tensors) {
  return with_meta(MessageKind::PsParameters, {{"version", p.version}, {"names", p.names}},
                   std::move(tensors));
}

Message to_message(const PsPush& p, std::vector<Tensor> tensors) {
  return with_meta(MessageKind::PsPush,
                   {{"version", p.version}, {"names", p.names}, {"compressed", p.compressed}},
                   std::move(tensors));
}

Message to_message(const PsError& e) {
  return with_meta(MessageKind::PsError, {{"message", e.message}}, {});
}

PsParameters read_ps_parameters(const Message& message) {
  Fields f = fields_of(message, MessageKind::PsParameters);
  PsParameters p;
  p.version = f.integer("version", 0, kMaxVersion);
  p.names = read_tensor_names(f, message);
  f.done();
  return p;
}

PsPush read_ps_push(const Message& message) {
  Fields f = fields_of(message, MessageKind::PsPush);
  PsPush p;
  p.version = f.integer("version", 0, kMaxVersion);
  p.names = read_tensor_names(f, message);
  p.compressed = f.boolean("compressed");
  f.done();
  return p;
}

PsError read_ps_error(const Message& message) {
  Fields f = fields_of(message, MessageKind::PsError);
  PsError e;
  e.message = f.string("message", kMaxControlString);
  f.done();
  return e;
}

}  // namespace pipit
