// TcpCommunicator with several threads sending at once. A frame is written by its sending
// thread when nothing is queued, else queued for the io thread: frames of every size from
// every thread must arrive whole and, per thread, in order, and closing must not race a
// thread that is writing.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "comm/tcp_communicator.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"
#include "support/tcp_pair.h"

using namespace pipit;
using namespace std::chrono_literals;

namespace {

// Sizes from 1 float to 1 Mi floats: small frames are written by their senders (whole or in
// part), large ones by the io thread, and frames queue behind both.
int64_t elements_for(int thread, int index) {
  const int64_t sizes[] = {1, 16, 1000, 65536, 1 << 20, 30000};
  return sizes[(thread + index) % 6];
}

float value_for(int thread, int index) {
  return static_cast<float>(thread * 1000 + index);
}

}  // namespace

TEST_CASE("frames sent by several threads at once arrive whole and, per thread, in order",
          "[tcp]") {
  const support::TcpPair pair = support::connected_tcp_pair();
  constexpr int kThreads = 4, kMessages = 60;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kMessages; ++i) {
        Tensor payload = full({elements_for(t, i)}, value_for(t, i));
        pair.a->send(1, Message(PipelineKind::Activation, t, i, 0, {payload}));
      }
    });
  }
  std::vector<int> next(kThreads, 0);
  int wrong_values = 0;
  for (int received = 0; received < kThreads * kMessages; ++received) {
    std::optional<Message> message = pair.b->try_receive(20000ms);
    REQUIRE(message.has_value());
    REQUIRE(message->kind == PipelineKind::Activation);
    const int t = static_cast<int>(message->step);
    REQUIRE((t >= 0 && t < kThreads));
    CHECK(message->microbatch == next[t]);
    next[t] = message->microbatch + 1;
    REQUIRE(message->tensors.size() == 1);
    const Tensor& tensor = message->tensors[0];
    REQUIRE(tensor.numel() == elements_for(t, message->microbatch));
    const float expected = value_for(t, message->microbatch);
    const float* data = tensor.data<float>();
    for (int64_t k = 0; k < tensor.numel(); ++k) wrong_values += data[k] != expected;
  }
  for (auto& sender : senders) sender.join();
  CHECK(wrong_values == 0);
  for (int t = 0; t < kThreads; ++t) CHECK(next[t] == kMessages);
}

TEST_CASE("closing a communicator while threads are sending on it ends cleanly", "[tcp]") {
  for (int round = 0; round < 3; ++round) {
    const support::TcpPair pair = support::connected_tcp_pair();
    std::atomic<bool> stop{false};
    std::vector<std::thread> senders;
    for (int t = 0; t < 3; ++t) {
      senders.emplace_back([&, t] {
        for (int i = 0; !stop; ++i) {
          pair.a->send(1, Message(PipelineKind::Activation, t, i, 0,
                                  {full({elements_for(t, i)}, value_for(t, i))}));
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 20 * round));
    pair.a->close();
    stop = true;
    for (auto& sender : senders) sender.join();
    // The peer sees the connection go: frames already received were whole, then PeerLost.
    bool lost = false;
    while (std::optional<Message> message = pair.b->try_receive(10000ms)) {
      if (message->kind == MessageKind::PeerLost) {
        lost = true;
        break;
      }
      REQUIRE(message->tensors.size() == 1);
      const Tensor& tensor = message->tensors[0];
      CHECK(tensor.data<float>()[tensor.numel() - 1] ==
            value_for(static_cast<int>(message->step), message->microbatch));
    }
    CHECK(lost);
  }
}
