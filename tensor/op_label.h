#pragma once
// What the op timers (tensor/op_timer.h, tensor/cuda/op_timer.h) share: the name a backend
// call is recorded under, and the depth guard that times only outermost calls.
#include <string>
#include <string_view>

#include "tensor/backend.h"

namespace pipit {

// The Backend method, with its op where it takes one: "binary.mul".
struct OpLabel {
  const char* method;
  const char* op = nullptr;
  std::string name() const { return op ? std::string(method) + "." + op : std::string(method); }
};
inline OpLabel label_of(const char* method, const auto&...) {
  return {method};
}
inline OpLabel label_of(const char* method, UnaryOp op, const auto&...) {
  return {method, op_name(op)};
}
inline OpLabel label_of(const char* method, BinaryOp op, const auto&...) {
  return {method, op_name(op)};
}
inline OpLabel label_of(const char* method, ReduceOp op, const auto&...) {
  return {method, op_name(op)};
}
// softmax(in, dim, log, out) and softmax_backward(grad, out, dim, log, grad_in) with log set
// are recorded as log_softmax and log_softmax_backward.
inline OpLabel label_of(const char* method, const Tensor&, int64_t, bool log, const Tensor&) {
  return {log && std::string_view(method) == "softmax" ? "log_softmax" : method};
}
inline OpLabel label_of(const char* method, const Tensor&, const Tensor&, int64_t, bool log,
                        const Tensor&) {
  return {log && std::string_view(method) == "softmax_backward" ? "log_softmax_backward" : method};
}

// How deep this thread is inside timed calls: a backend op that calls the backend again
// (through backend(), which returns the timer) must not be counted twice.
inline thread_local int timed_depth = 0;
struct TimedScope {
  TimedScope() { ++timed_depth; }
  ~TimedScope() { --timed_depth; }
  TimedScope(const TimedScope&) = delete;
  TimedScope& operator=(const TimedScope&) = delete;
};

// Forwards every op of PIPIT_BACKEND_OPS from Timer to its inner_ inside timed(), under the
// name label_of() gives it.
#define PIPIT_OP_TIMER_THEN(...) __VA_OPT__(, ) __VA_ARGS__
#define PIPIT_OP_TIMER_FORWARD(Timer, name, params, args)           \
  void Timer::name params {                                         \
    const OpLabel label = label_of(#name PIPIT_OP_TIMER_THEN args); \
    timed(label, [&] { inner_.name args; });                        \
  }

}  // namespace pipit
