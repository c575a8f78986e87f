#pragma once
// Control messages every layer above comm/ shares, and the tools to write their own. Each
// struct is the meta of one MessageKind; `to_message` writes it and the matching `read_*`
// reads it back, checking every field's presence, type and range and refusing fields it does
// not know, so a peer's message is either exactly understood or a ControlError naming the
// kind and the field. Layers above define their messages the same way, beside their kinds
// (pipeline/protocol/messages.h, ps/messages.h), with control_fields and control_message.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/json_fields.h"
#include "comm/message.h"

namespace pipit {

// A received control message does not say what its kind requires.
class ControlError : public Error {
 public:
  using Error::Error;
};

// A role (a pipeline stage, a parameter-server shard or worker, a pipit-worker process not yet
// given a role) -> whoever started it (coordinator, launcher): its work failed, or it could
// not be built.
struct RoleError {
  std::string role;  // which: "stage 2 of replica 1", "shard 0", "pipit-worker host:port"
  std::string message;
};

// A role -> whoever started it: the message's tensors are these weights, then these
// optimizer entries.
struct StateReply {
  std::vector<std::string> weights;
  std::vector<std::string> optimizer;
};

// Made locally by a networked communicator: a peer's connection failed.
struct PeerLost {
  int peer = 0;
  std::string address;
  std::string reason;
};

Message to_message(const RoleError& error, int64_t step);
Message to_message(const StateReply& state, int64_t step, std::vector<Tensor> tensors);
Message to_message(const PeerLost& lost);

RoleError read_role_error(const Message& message);
StateReply read_state_reply(const Message& message);  // also checks the tensor count
PeerLost read_peer_lost(const Message& message);
// Kinds without a struct (Shutdown, Ready, Start, Heartbeat, and upper layers' bare kinds)
// carry an empty object.
void read_empty(const Message& message);

// The fields of a message of `kind` (a ControlError if it is another kind), for a read_*.
JsonFields<ControlError> control_fields(const Message& message, MessageKind kind);
// A message of `kind` whose meta is `meta`, for a to_message.
Message control_message(MessageKind kind, int64_t step, nlohmann::json meta,
                        std::vector<Tensor> tensors = {});

// Bounds on what a peer can make a receiver allocate through a control message.
constexpr int kMaxMicrobatches = 1 << 16;
constexpr size_t kMaxControlString = 1 << 16;
constexpr size_t kMaxControlList = 1 << 22;

}  // namespace pipit
