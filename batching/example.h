#pragma once
// Per-example coroutines (C++20) for batched inference with data-dependent control flow:
// each example is a coroutine that runs its own loop and `co_await`s batched calls; when
// every live example waits, run_examples runs the graph once and resumes them all with
// their values. Examples may finish at different times (variable-length decoding).
//   Example decode(Tensor x, std::vector<int64_t>& tokens) {
//     Handle state = batched_value(x);
//     while (tokens.size() < limit) {
//       auto [next, logits] = step(state);
//       int64_t token = argmax((co_await logits), 0).item<int64_t>();
//       if (token == end) co_return;
//       tokens.push_back(token);
//       state = next;
//     }
//   }
//   std::vector<Example> examples;  ... examples.push_back(decode(x, out[i]));
//   run_examples(examples);
#include <coroutine>
#include <exception>
#include <vector>

#include "batching/graph.h"

namespace pipit::batching {

class Example {
 public:
  struct promise_type {
    std::exception_ptr error;
    Example get_return_object() {
      return Example(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };

  Example(Example&& other) noexcept : coroutine_(other.coroutine_) { other.coroutine_ = {}; }
  Example& operator=(Example&& other) noexcept;
  Example(const Example&) = delete;
  ~Example();

  bool done() const { return !coroutine_ || coroutine_.done(); }
  std::exception_ptr error() const { return coroutine_ ? coroutine_.promise().error : nullptr; }
  std::coroutine_handle<promise_type> coroutine() const { return coroutine_; }

 private:
  explicit Example(std::coroutine_handle<promise_type> coroutine) : coroutine_(coroutine) {}
  std::coroutine_handle<promise_type> coroutine_;
};

// `co_await handle` inside an Example: suspends until the graph has run, then gives the
// handle's value; throws what the batch threw if it failed.
struct HandleAwaiter {
  Handle handle;
  bool await_ready() const { return handle.ready(); }
  void await_suspend(std::coroutine_handle<> waiting) const;
  Tensor await_resume() const;
};
inline HandleAwaiter operator co_await(Handle handle) {
  return {std::move(handle)};
}

struct ExampleStats {
  int64_t rounds = 0;  // graph runs
  GraphStats graph;
};

// Runs the examples to the end, in one graph: each round resumes every waiting example until
// it waits again or ends, then runs the graph. The first example that ended with an error is
// rethrown, naming its index, once all have ended.
ExampleStats run_examples(std::vector<Example>& examples, Strategy strategy = Strategy::agenda);

// Several groups, each with its own graph, taking turns: while one group's graph runs on a
// second thread, this thread resumes another group's examples (building its next graph), so
// the CPU work of one overlaps the batched compute of another.
ExampleStats run_examples(std::vector<std::vector<Example>>& groups,
                          Strategy strategy = Strategy::agenda);

}  // namespace pipit::batching
