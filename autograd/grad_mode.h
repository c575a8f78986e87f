#pragma once

namespace pipit {

// Whether differentiable ops record the graph on this thread (each pipeline stage has its own).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Disables graph recording on this thread for its lifetime.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace pipit
