#include "comm/message.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pipit {
namespace {

struct Registry;
void add(Registry& r, const MessageKindInfo& info);

struct Registry {
  Registry() {
    for (const MessageKindInfo& info : {
             MessageKindInfo{MessageKind::Shutdown, "Shutdown", "comm", true},
             MessageKindInfo{MessageKind::State, "State", "comm"},
             MessageKindInfo{MessageKind::RoleError, "RoleError", "comm"},
             MessageKindInfo{MessageKind::Hello, "Hello", "comm"},
             MessageKindInfo{MessageKind::Ready, "Ready", "comm"},
             MessageKindInfo{MessageKind::Start, "Start", "comm", true},
             MessageKindInfo{MessageKind::Heartbeat, "Heartbeat", "comm"},
             MessageKindInfo{MessageKind::PeerLost, "PeerLost", "comm"},
             MessageKindInfo{MessageKind::AllReduceSegment, "AllReduceSegment", "comm"},
             MessageKindInfo{MessageKind::PairSumDone, "PairSumDone", "comm"},
         }) {
      add(*this, info);
    }
  }

  std::mutex mutex;
  std::array<MessageKindInfo, 256> kinds{};
  std::array<bool, 256> known{};
};

bool same(const MessageKindInfo& a, const MessageKindInfo& b) {
  return std::strcmp(a.name, b.name) == 0 && std::strcmp(a.owner, b.owner) == 0 &&
         a.from_coordinator_only == b.from_coordinator_only;
}

void add(Registry& r, const MessageKindInfo& info) {
  const size_t value = static_cast<uint8_t>(info.kind);
  if (r.known[value] && !same(r.kinds[value], info)) {
    std::fprintf(stderr, "pipit: message kind %zu registered twice: as %s (%s) and as %s (%s)\n",
                 value, r.kinds[value].name, r.kinds[value].owner, info.name, info.owner);
    std::abort();
  }
  r.kinds[value] = info;
  r.known[value] = true;
}

// Built on first use, so registrations from other files' static initializers find it.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool register_message_kinds(std::initializer_list<MessageKindInfo> kinds) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const MessageKindInfo& info : kinds) add(r, info);
  return true;
}

const MessageKindInfo* find_message_kind(MessageKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const size_t value = static_cast<uint8_t>(kind);
  return r.known[value] ? &r.kinds[value] : nullptr;
}

std::vector<MessageKindInfo> registered_message_kinds() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<MessageKindInfo> out;
  for (size_t value = 0; value < r.kinds.size(); ++value) {
    if (r.known[value]) out.push_back(r.kinds[value]);
  }
  return out;
}

const char* message_kind_name(MessageKind kind) {
  const MessageKindInfo* info = find_message_kind(kind);
  return info ? info->name : "unknown";
}

bool is_coordinator_command(MessageKind kind) {
  const MessageKindInfo* info = find_message_kind(kind);
  return info && info->from_coordinator_only;
}

}  // namespace pipit
