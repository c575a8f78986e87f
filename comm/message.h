#pragma once
// Message: what the processes of a run say to each other. Data messages carry tensors;
// control messages carry JSON in `meta` (comm/control.h). The step number lets a receiver
// drop what is left of an aborted step.
//
// The kinds are an open set. comm/ defines the transport's own and those every role shares
// (below); each layer above declares its kinds beside its messages (pipeline/protocol/
// messages.h, ps/messages.h) and registers their names, so comm/ names no upper layer's
// concept. A frame of a kind nobody in the process registered is refused.
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace pipit {

// The byte on the wire. Values are fixed forever: a peer of another version reads them.
enum class MessageKind : uint8_t {
  Shutdown = 4,    // whoever started a role -> the role: stop serving
  State = 6,       // role -> its starter: tensors with comm/control.h's StateReply
  RoleError = 11,  // role -> its starter: its work failed (RoleError)
  // Connection management (networked communicators and launchers).
  Hello = 12,  // the handshake (comm/handshake.h)
  Ready = 14,  // a role is built and waits for Start
  Start = 15,
  Heartbeat = 16,
  // Made locally by a networked communicator, never sent: a peer's connection failed.
  PeerLost = 17,  // PeerLost
  // All-reduce (comm/all_reduce.h), member -> member: step: the all-reduce's tag;
  // microbatch: the segment; chunk: 0 (partial sum) or 1 (result); tensors: {the segment}.
  AllReduceSegment = 33,
  // Made locally by a communicator, never sent: a sum Communicator::start_pair_sum started
  // is in its tensor. step, microbatch: the sum's step and part.
  PairSumDone = 35,
};

// One kind as a layer registers it.
struct MessageKindInfo {
  MessageKind kind;
  const char* name;   // as error messages and traces print it
  const char* owner;  // the layer that defines it: "comm", "pipeline", "ps"
  // Only a coordinator or launcher sends it: receivers ignore it from anyone else.
  bool from_coordinator_only = false;
};

// Adds kinds to the process-wide registry (idempotent for the same entries). Two different
// entries for one value are a programming error: it prints both and aborts. Returns true, so
// a header can register its kinds in an inline variable's initializer.
bool register_message_kinds(std::initializer_list<MessageKindInfo> kinds);
// The registered entry of a kind, or null.
const MessageKindInfo* find_message_kind(MessageKind kind);
// Every registered kind, by value.
std::vector<MessageKindInfo> registered_message_kinds();
// The kind's registered name, or "unknown".
const char* message_kind_name(MessageKind kind);
// Whether only a coordinator or launcher sends this kind (registered so).
bool is_coordinator_command(MessageKind kind);

struct Message {
  Message() = default;
  Message(MessageKind kind, int64_t step, int microbatch = 0, int chunk = 0,
          std::vector<Tensor> tensors = {})
      : kind(kind), step(step), microbatch(microbatch), chunk(chunk), tensors(std::move(tensors)) {}

  MessageKind kind = MessageKind::Heartbeat;
  int64_t step = 0;
  int microbatch = 0;
  int chunk = 0;
  std::vector<Tensor> tensors;
  nlohmann::json meta = nlohmann::json::object();
  int from = 0;  // set by the communicator on receipt: the sender's endpoint id
};

}  // namespace pipit
