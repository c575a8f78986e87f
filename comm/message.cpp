#include "comm/message.h"

namespace pipit {

const char* message_kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::StepBegin:
      return "StepBegin";
    case MessageKind::OptimizerStep:
      return "OptimizerStep";
    case MessageKind::Abort:
      return "Abort";
    case MessageKind::Shutdown:
      return "Shutdown";
    case MessageKind::FetchState:
      return "FetchState";
    case MessageKind::State:
      return "State";
    case MessageKind::Activation:
      return "Activation";
    case MessageKind::Gradient:
      return "Gradient";
    case MessageKind::StageDone:
      return "StageDone";
    case MessageKind::OptimizerDone:
      return "OptimizerDone";
    case MessageKind::StageError:
      return "StageError";
    case MessageKind::Hello:
      return "Hello";
    case MessageKind::StagePackage:
      return "StagePackage";
    case MessageKind::Ready:
      return "Ready";
    case MessageKind::Start:
      return "Start";
    case MessageKind::Heartbeat:
      return "Heartbeat";
    case MessageKind::PeerLost:
      return "PeerLost";
    case MessageKind::RemapPrepare:
      return "RemapPrepare";
    case MessageKind::LayerTransfer:
      return "LayerTransfer";
    case MessageKind::RemapReady:
      return "RemapReady";
    case MessageKind::RemapCommit:
      return "RemapCommit";
    case MessageKind::RemapDone:
      return "RemapDone";
    case MessageKind::PsJoin:
      return "PsJoin";
    case MessageKind::PsParameters:
      return "PsParameters";
    case MessageKind::PsPush:
      return "PsPush";
    case MessageKind::PsLeave:
      return "PsLeave";
    case MessageKind::PsError:
      return "PsError";
    case MessageKind::PsPackage:
      return "PsPackage";
    case MessageKind::TiedGradient:
      return "TiedGradient";
    case MessageKind::GenerateBegin:
      return "GenerateBegin";
    case MessageKind::GenerateStep:
      return "GenerateStep";
    case MessageKind::GenerateEnd:
      return "GenerateEnd";
    case MessageKind::AllReduceSegment:
      return "AllReduceSegment";
  }
  return "unknown";
}

}  // namespace pipit
