// The Inbox every communicator receives through: messages come out in the order they went
// in; a pending one (comm/inbox.h) is decoded by the receiving thread and, if dropped, is
// skipped without ending the wait; a transport's polling hook runs on the receiving thread
// while it polls.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <thread>

#include "comm/communicator.h"
#include "comm/inbox.h"
#include "pipeline/protocol/messages.h"

using namespace pipit;
using namespace std::chrono_literals;

namespace {

// Decodes to a message of `step`, or is dropped (nullopt step); records the decoding thread.
class Pending final : public PendingMessage {
 public:
  Pending(std::optional<int64_t> step, std::thread::id* decoded_on)
      : step_(step), decoded_on_(decoded_on) {}
  std::optional<Message> take() override {
    *decoded_on_ = std::this_thread::get_id();
    if (!step_) return std::nullopt;
    return Message(PipelineKind::Activation, *step_);
  }

 private:
  std::optional<int64_t> step_;
  std::thread::id* decoded_on_;
};

}  // namespace

TEST_CASE("Inbox: pending messages are decoded by the receiver, in order, dropped ones skipped",
          "[comm]") {
  Inbox inbox("test");
  std::thread::id decoded_b, decoded_c;
  std::thread sender([&] {
    inbox.push(Message(PipelineKind::Activation, 1));
    inbox.push(std::make_unique<Pending>(2, &decoded_b));
    inbox.push(std::make_unique<Pending>(std::nullopt, &decoded_c));
    inbox.push(Message(PipelineKind::Activation, 4));
  });
  sender.join();
  CHECK(inbox.pop().step == 1);
  CHECK(inbox.pop().step == 2);
  CHECK(decoded_b == std::this_thread::get_id());
  CHECK(inbox.pop().step == 4);  // the dropped one was skipped
  CHECK(decoded_c == std::this_thread::get_id());
  CHECK_FALSE(inbox.pop_for(1ms).has_value());
  inbox.close();
  CHECK_THROWS_AS(inbox.pop(), ClosedError);
}

TEST_CASE("Inbox: a dropped pending message does not end a wait", "[comm]") {
  Inbox inbox("test");
  std::thread::id decoded;
  std::thread sender([&] {
    inbox.push(std::make_unique<Pending>(std::nullopt, &decoded));
    std::this_thread::sleep_for(20ms);
    inbox.push(Message(PipelineKind::Gradient, 9));
  });
  const std::optional<Message> timed = inbox.pop_for(10s);
  sender.join();
  REQUIRE(timed.has_value());
  CHECK(timed->kind == PipelineKind::Gradient);
  CHECK(timed->step == 9);
  inbox.push(std::make_unique<Pending>(std::nullopt, &decoded));
  CHECK_FALSE(inbox.pop_for(5ms).has_value());
}

TEST_CASE("Inbox: the polling hook runs on the receiving thread and can deliver", "[comm]") {
  // A transport that moves messages on the receiver's thread (MPI) delivers from the hook.
  std::atomic<int> calls{0};
  std::thread::id hook_thread;
  Inbox* self = nullptr;
  Inbox inbox("test", [&] {
    hook_thread = std::this_thread::get_id();
    if (++calls == 1) self->push(Message(PipelineKind::Activation, 3));
  });
  self = &inbox;
  // Should the receiver be descheduled past its polling window, it sleeps; this wakes it (and
  // fails the test) instead of leaving it waiting.
  std::atomic<bool> received{false};
  std::thread rescue([&] {
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    while (!received && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(10ms);
    }
    if (!received) inbox.push(Message(MessageKind::Heartbeat, -1));
  });
  const Message message = inbox.pop();
  received = true;
  rescue.join();
  CHECK(message.step == 3);
  CHECK(calls == 1);
  CHECK(hook_thread == std::this_thread::get_id());
}
