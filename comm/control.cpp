#include "comm/control.h"

#include <limits>

namespace pipit {
namespace {

using json = nlohmann::json;
using Fields = JsonFields<ControlError>;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

}  // namespace

Fields control_fields(const Message& message, MessageKind kind) {
  if (message.kind != kind) {
    throw ControlError(detail::concat("expected a ", message_kind_name(kind), " message, got ",
                                      message_kind_name(message.kind)));
  }
  return Fields(message.meta, std::string(message_kind_name(kind)) + " message");
}

Message control_message(MessageKind kind, int64_t step, json meta, std::vector<Tensor> tensors) {
  Message message(kind, step, 0, 0, std::move(tensors));
  message.meta = std::move(meta);
  return message;
}

Message to_message(const RoleError& e, int64_t step) {
  return control_message(MessageKind::RoleError, step, {{"role", e.role}, {"message", e.message}});
}

Message to_message(const StateReply& s, int64_t step, std::vector<Tensor> tensors) {
  return control_message(MessageKind::State, step,
                         {{"weights", s.weights}, {"optimizer", s.optimizer}}, std::move(tensors));
}

Message to_message(const PeerLost& lost) {
  Message message =
      control_message(MessageKind::PeerLost, -1,
                      {{"peer", lost.peer}, {"address", lost.address}, {"reason", lost.reason}});
  message.from = lost.peer;
  return message;
}

RoleError read_role_error(const Message& message) {
  Fields f = control_fields(message, MessageKind::RoleError);
  RoleError e;
  e.role = f.string("role", kMaxControlString);
  e.message = f.string("message", kMaxControlString);
  f.done();
  return e;
}

StateReply read_state_reply(const Message& message) {
  Fields f = control_fields(message, MessageKind::State);
  StateReply s;
  s.weights = f.strings("weights", kMaxControlList, kMaxControlString);
  s.optimizer = f.strings("optimizer", kMaxControlList, kMaxControlString);
  f.done();
  if (s.weights.size() + s.optimizer.size() != message.tensors.size()) {
    f.fail("names ", s.weights.size() + s.optimizer.size(), " tensors but carries ",
           message.tensors.size());
  }
  return s;
}

PeerLost read_peer_lost(const Message& message) {
  Fields f = control_fields(message, MessageKind::PeerLost);
  PeerLost lost;
  lost.peer = static_cast<int>(f.integer("peer", std::numeric_limits<int>::min(), kIntMax));
  lost.address = f.string("address", kMaxControlString);
  lost.reason = f.string("reason", kMaxControlString);
  f.done();
  return lost;
}

void read_empty(const Message& message) {
  Fields(message.meta, std::string(message_kind_name(message.kind)) + " message").done();
}

}  // namespace pipit
