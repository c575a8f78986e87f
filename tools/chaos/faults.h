#pragma once
// The faults a chaos session injects, and the seeded plan that picks them: which kind, which
// worker, at which point of the run. The same seed gives the same plan; what the faults then
// meet depends on timing.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "tools/chaos/proxy.h"

namespace pipit::chaos {

enum class FaultKind {
  KillWorker,                 // SIGKILL a worker
  StopWorkerBrief,            // SIGSTOP a worker for a quarter of the peer timeout, then SIGCONT
  StopWorkerCont,             // SIGSTOP a worker past the peer timeout, then SIGCONT
  StopWorkerKill,             // SIGSTOP a worker past the peer timeout, then SIGKILL
  KillCoordinator,            // SIGKILL the trainer
  KillCoordinatorCheckpoint,  // SIGKILL the trainer as it creates a checkpoint's temporary
  StopCoordinatorCheckpoint,  // SIGSTOP it then, past the peer timeout, then SIGCONT
  StopCoordinatorKill,        // SIGSTOP the trainer past the peer timeout, then SIGKILL
  Cut,                        // the proxy closes a connection inside a frame
  Flip,                       // the proxy flips a byte of a frame's headers
  FlipData,                   // the proxy flips a byte of tensor data
  Stall,                      // the proxy stops forwarding past the peer timeout
  DiskFull,                   // the checkpoint file system fills up
};

// Each kind's name on the command line and in reports, in FaultKind's order.
inline constexpr const char* kFaultNames[] = {"kill-worker",
                                              "stop-worker-brief",
                                              "stop-worker-cont",
                                              "stop-worker-kill",
                                              "kill-coordinator",
                                              "kill-coordinator-checkpoint",
                                              "stop-coordinator-checkpoint",
                                              "stop-coordinator-kill",
                                              "cut",
                                              "flip",
                                              "flip-data",
                                              "stall",
                                              "disk-full"};
static_assert(std::size(kFaultNames) == static_cast<size_t>(FaultKind::DiskFull) + 1);

inline std::string fault_name(FaultKind kind) {
  return kFaultNames[static_cast<size_t>(kind)];
}

inline FaultKind parse_fault_kind(const std::string& text) {
  const auto it = std::find(std::begin(kFaultNames), std::end(kFaultNames), text);
  if (it == std::end(kFaultNames)) throw Error("chaos: unknown fault kind '" + text + "'");
  return static_cast<FaultKind>(it - std::begin(kFaultNames));
}

// Every kind. (flip-data was left out until frames carried a checksum: a flipped tensor byte
// then changed training silently; see docs/RELIABILITY.md.)
inline std::vector<FaultKind> default_fault_kinds() {
  std::vector<FaultKind> kinds;
  for (size_t i = 0; i < std::size(kFaultNames); ++i) kinds.push_back(static_cast<FaultKind>(i));
  return kinds;
}

enum class Trigger {
  AfterStart,         // `delay` x the trainer's start-up time after it was started
  AtStep,             // `delay` x a step's time after the trainer printed step now + ahead
  OnCheckpointWrite,  // the moment the trainer creates a checkpoint's temporary file
};

struct Fault {
  FaultKind kind = FaultKind::KillWorker;
  Trigger trigger = Trigger::AtStep;
  int worker = 0;    // worker and proxy faults: which one
  int ahead = 1;     // AtStep
  double delay = 0;  // AfterStart, AtStep
  ProxyFault proxy;  // proxy faults

  bool hits_coordinator() const {
    return kind == FaultKind::KillCoordinator || kind == FaultKind::KillCoordinatorCheckpoint ||
           kind == FaultKind::StopCoordinatorCheckpoint || kind == FaultKind::StopCoordinatorKill;
  }
  // "cut", "flip (frame JSON header)", ...: the rows of the report.
  std::string label() const {
    if (kind == FaultKind::Cut || kind == FaultKind::Flip) {
      return fault_name(kind) + " (" + region_name(proxy.region) + ")";
    }
    return fault_name(kind);
  }
  std::string where() const {
    std::string text = hits_coordinator() || kind == FaultKind::DiskFull
                           ? ""
                           : "worker " + std::to_string(worker) + ", ";
    switch (trigger) {
      case Trigger::AfterStart:
        return text + "during start-up";
      case Trigger::AtStep:
        return text + "in step +" + std::to_string(ahead);
      case Trigger::OnCheckpointWrite:
        return text + "as a checkpoint is written";
    }
    return text;
  }
};

// The parts of a frame a "flip" fault may hit: every part but the tensor data (flip-data's).
inline std::vector<Region> header_regions() {
  return {Region::FixedHeader, Region::FrameJson, Region::BodyLength, Region::TensorJson};
}

// `count` faults from `kinds`, every kind once per round in a shuffled order; flips hit one
// of `flip_regions`.
inline std::vector<Fault> plan_faults(uint64_t seed, int count, std::vector<FaultKind> kinds,
                                      int workers, int checkpoint_every,
                                      const std::vector<Region>& flip_regions = header_regions()) {
  PIPIT_CHECK(!kinds.empty() && !flip_regions.empty(), "chaos: no fault kinds to choose from");
  std::mt19937_64 random(seed);
  auto below = [&](uint64_t n) { return static_cast<int>(random() % n); };
  auto unit = [&] { return static_cast<double>(random() >> 11) * 0x1p-53; };
  std::vector<Fault> plan;
  while (static_cast<int>(plan.size()) < count) {
    for (size_t i = kinds.size(); i > 1; --i)
      std::swap(kinds[i - 1], kinds[static_cast<size_t>(below(i))]);
    for (FaultKind kind : kinds) {
      if (static_cast<int>(plan.size()) == count) break;
      Fault fault;
      fault.kind = kind;
      fault.worker = below(static_cast<uint64_t>(workers));
      fault.ahead = 1 + below(static_cast<uint64_t>(std::max(1, 2 * checkpoint_every)));
      fault.delay = unit();
      const bool may_hit_startup = kind == FaultKind::KillWorker ||
                                   kind == FaultKind::KillCoordinator || kind == FaultKind::Cut ||
                                   kind == FaultKind::Flip || kind == FaultKind::FlipData;
      fault.trigger = may_hit_startup && below(4) == 0 ? Trigger::AfterStart : Trigger::AtStep;
      if (kind == FaultKind::KillCoordinatorCheckpoint ||
          kind == FaultKind::StopCoordinatorCheckpoint) {
        fault.trigger = Trigger::OnCheckpointWrite;
      }
      fault.proxy.kind = kind == FaultKind::Cut     ? ProxyFault::Kind::Cut
                         : kind == FaultKind::Stall ? ProxyFault::Kind::Stall
                                                    : ProxyFault::Kind::Flip;
      fault.proxy.fraction = unit();
      fault.proxy.direction = static_cast<ProxyFault::Direction>(below(3));
      fault.proxy.mask = static_cast<uint8_t>(1 + below(255));
      const Region flip_region = flip_regions[static_cast<size_t>(below(flip_regions.size()))];
      fault.proxy.region = kind == FaultKind::FlipData ? Region::TensorData
                           : kind == FaultKind::Flip   ? flip_region
                                                       : static_cast<Region>(below(5));
      plan.push_back(fault);
    }
  }
  return plan;
}

}  // namespace pipit::chaos
