#pragma once
// Typed meta of the parameter-server messages (PsKind below). Each read_* checks every field and
// the tensor count, and refuses fields it does not know; a malformed message is a ControlError
// naming the kind and field.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/control.h"

namespace pipit {

// The parameter server's message kinds (comm/message.h's registry; values fixed on the wire).
struct PsKind {
  static constexpr MessageKind Join{23};        // worker -> server: send me the parameters
  static constexpr MessageKind Parameters{24};  // server -> worker: PsParameters
  static constexpr MessageKind Push{25};        // worker -> server: PsPush
  static constexpr MessageKind Leave{26};       // worker -> server: no more pushes from me
  static constexpr MessageKind Error{27};       // server -> worker: PsError
  // Launcher -> pipit-worker: serve a shard or worker role (ps/package.h).
  static constexpr MessageKind Package{28};
};

// Registers PsKind's names; every file that sees the kinds runs it before main.
bool register_ps_message_kinds();
inline const bool kPsMessageKindsRegistered = register_ps_message_kinds();

// Server -> worker: the shard's parameters, named in the tensors' order, at `version`
// (updates the shard has applied).
struct PsParameters {
  int64_t version = 0;
  std::vector<std::string> names;
};

// Worker -> server: gradients of the named parameters (a subset of the shard's: a parameter
// the batch did not reach has none), computed from the parameters the worker read at
// `version`; bf16 when compressed, else the parameters' dtype. A step's push may come in
// parts, as the backward makes gradients final; `last` marks the step's final part, and no
// parameter comes twice in one step.
struct PsPush {
  int64_t version = 0;
  std::vector<std::string> names;
  bool compressed = false;
  bool last = true;
};

// Server -> worker: why the run cannot go on, or why a push was refused.
struct PsError {
  std::string message;
};

Message to_message(const PsParameters& parameters, std::vector<Tensor> tensors);
Message to_message(const PsPush& push, std::vector<Tensor> tensors);
Message to_message(const PsError& error);

PsParameters read_ps_parameters(const Message& message);
PsPush read_ps_push(const Message& message);
PsError read_ps_error(const Message& message);

}  // namespace pipit
