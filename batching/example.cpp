#include "batching/example.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "autograd/grad_mode.h"

namespace pipit::batching {
namespace {

struct Group {
  std::vector<Example>* examples = nullptr;
  Graph graph;
  std::vector<std::coroutine_handle<>> waiting;
  std::exception_ptr batch_error;  // what the last run threw, for the examples it resumes
  bool started = false;
};

thread_local Group* current_group = nullptr;

// Resumes the group's waiting examples (all of them, the first time) until each waits again
// or ends.
void advance(Group& group) {
  std::vector<std::coroutine_handle<>> resume;
  if (!group.started) {
    for (Example& e : *group.examples) {
      if (!e.done()) resume.push_back(e.coroutine());
    }
    group.started = true;
  } else {
    resume.swap(group.waiting);
  }
  auto scope = group.graph.scope();
  Group* previous = current_group;
  current_group = &group;
  for (std::coroutine_handle<> c : resume) c.resume();
  current_group = previous;
  group.batch_error = nullptr;
}

void run_graph(Group& group, Strategy strategy) {
  try {
    group.graph.run(strategy);
  } catch (...) {
    group.batch_error = std::current_exception();
  }
}

// The second thread of run_examples with several groups: runs one group's graph at a time.
class GraphRunner {
 public:
  GraphRunner(bool grad, Strategy strategy)
      : thread_([this, grad, strategy] {
          set_grad_enabled(grad);
          std::unique_lock<std::mutex> lock(mutex_);
          while (true) {
            changed_.wait(lock, [this] { return stopping_ || group_ != nullptr; });
            if (!group_) return;
            lock.unlock();
            run_graph(*group_, strategy);
            lock.lock();
            group_ = nullptr;
            changed_.notify_all();
          }
        }) {}
  ~GraphRunner() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void start(Group& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    group_ = &group;
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return group_ == nullptr; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  Group* group_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;  // last: it starts once the members it uses exist
};

void rethrow_first_error(const std::vector<Group>& groups) {
  size_t index = 0;
  for (const Group& g : groups) {
    for (const Example& e : *g.examples) {
      if (std::exception_ptr error = e.error()) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& what) {
          throw Error(detail::concat("batching: example ", index, " failed: ", what.what()));
        }
      }
      ++index;
    }
  }
}

ExampleStats run_groups(std::vector<Group>& groups, Strategy strategy) {
  ExampleStats stats;
  std::deque<size_t> built;
  for (size_t i = 0; i < groups.size(); ++i) {
    advance(groups[i]);
    if (!groups[i].waiting.empty()) built.push_back(i);
  }
  if (groups.size() == 1) {
    while (!built.empty()) {
      run_graph(groups[0], strategy);
      ++stats.rounds;
      advance(groups[0]);
      if (groups[0].waiting.empty()) built.clear();
    }
  } else {
    // One graph runs on the second thread while this one builds another group's next graph.
    GraphRunner runner(is_grad_enabled(), strategy);
    size_t flying = groups.size();
    auto launch = [&] {
      flying = built.front();
      built.pop_front();
      runner.start(groups[flying]);
    };
    while (flying != groups.size() || !built.empty()) {
      if (flying == groups.size()) {
        launch();
        continue;
      }
      runner.wait();
      ++stats.rounds;
      const size_t done = flying;
      flying = groups.size();
      if (!built.empty()) launch();
      advance(groups[done]);
      if (!groups[done].waiting.empty()) built.push_back(done);
    }
  }
  for (const Group& g : groups) {
    const GraphStats& s = g.graph.stats();
    stats.graph.nodes_run += s.nodes_run;
    stats.graph.batches_run += s.batches_run;
    stats.graph.gathers += s.gathers;
    stats.graph.views += s.views;
    stats.graph.plan_seconds += s.plan_seconds;
    stats.graph.run_seconds += s.run_seconds;
  }
  rethrow_first_error(groups);
  return stats;
}

}  // namespace

Example& Example::operator=(Example&& other) noexcept {
  if (this != &other) {
    if (coroutine_) coroutine_.destroy();
    coroutine_ = other.coroutine_;
    other.coroutine_ = {};
  }
  return *this;
}

Example::~Example() {
  if (coroutine_) coroutine_.destroy();
}

void HandleAwaiter::await_suspend(std::coroutine_handle<> waiting) const {
  PIPIT_CHECK(current_group != nullptr, "batching: co_await of a Handle outside run_examples (",
              handle.describe(), ")");
  current_group->waiting.push_back(waiting);
}

Tensor HandleAwaiter::await_resume() const {
  if (current_group && current_group->batch_error) {
    std::rethrow_exception(current_group->batch_error);
  }
  return handle.value();
}

ExampleStats run_examples(std::vector<Example>& examples, Strategy strategy) {
  std::vector<Group> groups(1);
  groups[0].examples = &examples;
  return run_groups(groups, strategy);
}

ExampleStats run_examples(std::vector<std::vector<Example>>& groups, Strategy strategy) {
  std::vector<Group> state(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) state[i].examples = &groups[i];
  return run_groups(state, strategy);
}

}  // namespace pipit::batching
