// Typed control messages: each round-trips exactly, and every malformed field is a
// ControlError naming the kind and the field, never a silent default.
#include <catch2/catch.hpp>

#include "comm/frame.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"

using namespace pipit;

namespace {

// Through the wire format too, so what is checked is what a peer would receive.
Message over_the_wire(const Message& message) {
  const std::string bytes = encode_frame(message);
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(bytes.data()));
  return decode_frame_payload(
      header, std::string_view(bytes).substr(kFrameHeaderSize, header.header_length),
      std::string_view(bytes).substr(kFrameHeaderSize + header.header_length));
}

Message with(Message message, const char* field, nlohmann::json value) {
  message.meta[field] = std::move(value);
  return message;
}

Message without(Message message, const char* field) {
  message.meta.erase(field);
  return message;
}

}  // namespace

TEST_CASE("control messages round-trip through frames exactly", "[control]") {
  const StepBegin b =
      read_step_begin(over_the_wire(to_message(StepBegin{false, 7, true, true}, 3)));
  CHECK_FALSE(b.train);
  CHECK(b.microbatches == 7);
  CHECK(b.trace);
  CHECK(b.grad_norm);

  OptimizerStep o{0.125, 0.5, false};
  const OptimizerStep o2 = read_optimizer_step(over_the_wire(to_message(o, 3)));
  CHECK(o2.lr == 0.125);
  CHECK(o2.grad_scale == 0.5);
  CHECK_FALSE(o2.skip);
  CHECK_FALSE(read_optimizer_step(over_the_wire(to_message(OptimizerStep{}, 1))).lr.has_value());

  StageDone d;
  d.peak_stashed = 4;
  d.peak_deferred = 3;
  d.grad_norm_sq = 2.25;
  d.trace = {{1, 2, 1, 10.5, 20.25}, {0, 0, 0, 1, 2}, {0, 1, 3, 2, 3}};
  const StageDone d2 = read_stage_done(over_the_wire(to_message(d, 9)));
  CHECK(d2.peak_stashed == 4);
  CHECK(d2.peak_deferred == 3);
  CHECK(d2.grad_norm_sq == 2.25);
  REQUIRE(d2.trace.size() == 3);
  CHECK(d2.trace[0].microbatch == 1);
  CHECK(d2.trace[0].chunk == 2);
  CHECK(d2.trace[0].phase == 1);
  CHECK(d2.trace[0].end_us == 20.25);
  CHECK(d2.trace[1].phase == 0);
  CHECK(d2.trace[2].phase == 3);

  const RoleError e = read_role_error(over_the_wire(to_message(RoleError{"shard 2", "boom"}, 1)));
  CHECK(e.role == "shard 2");
  CHECK(e.message == "boom");

  const Message state = to_message(StateReply{{"0.weight"}, {"step"}}, 1, {zeros({2}), zeros({})});
  const StateReply s = read_state_reply(over_the_wire(state));
  CHECK(s.weights == std::vector<std::string>{"0.weight"});
  CHECK(s.optimizer == std::vector<std::string>{"step"});

  const PeerLost lost = read_peer_lost(to_message(PeerLost{3, "127.0.0.1:7003", "reset"}));
  CHECK(lost.peer == 3);
  CHECK(lost.address == "127.0.0.1:7003");
  CHECK(lost.reason == "reset");
}

TEST_CASE("malformed control messages are ControlErrors naming kind and field", "[control]") {
  const Message begin = to_message(StepBegin{}, 1);
  CHECK_THROWS_MATCHES(read_step_begin(with(begin, "microbatches", 0)), ControlError,
                       Catch::Message("StepBegin message field \"microbatches\" is 0, not an "
                                      "integer in [1, 65536]"));
  CHECK_THROWS_WITH(read_step_begin(with(begin, "microbatches", 1 << 20)),
                    Catch::Contains("\"microbatches\""));
  CHECK_THROWS_WITH(read_step_begin(with(begin, "microbatches", 2.5)),
                    Catch::Contains("\"microbatches\""));
  CHECK_THROWS_WITH(read_step_begin(with(begin, "train", 1)),
                    Catch::Contains("\"train\" is not true or false"));
  CHECK_THROWS_WITH(read_step_begin(without(begin, "trace")),
                    Catch::Contains("lacks the field \"trace\""));
  CHECK_THROWS_WITH(read_step_begin(with(begin, "colour", "red")),
                    Catch::Contains("unknown field \"colour\""));
  CHECK_THROWS_AS(read_step_begin(Message(PipelineKind::Abort, 1)), ControlError);

  const Message step = to_message(OptimizerStep{}, 1);
  CHECK_THROWS_WITH(read_optimizer_step(with(step, "lr", "fast")), Catch::Contains("\"lr\""));
  CHECK_THROWS_WITH(read_optimizer_step(with(step, "grad_scale", nullptr)),
                    Catch::Contains("\"grad_scale\""));

  const Message done = to_message(StageDone{}, 1);
  CHECK_THROWS_WITH(read_stage_done(with(done, "trace", {{1, 2, 3}})),
                    Catch::Contains("\"trace\""));
  // Phases 0..5 are F, B, I, W, R and S (a gradient sum over replicas); 6 is none.
  CHECK_THROWS_WITH(read_stage_done(with(done, "trace", {{1, 2, 6, 0.0, 1.0}})),
                    Catch::Contains("out-of-range"));
  CHECK(read_stage_done(with(done, "trace", {{1, 2, 5, 0.0, 1.0}})).trace.at(0).phase == 5);
  CHECK_THROWS_WITH(read_stage_done(with(done, "peak_stashed", -1)),
                    Catch::Contains("\"peak_stashed\""));

  CHECK_THROWS_WITH(read_role_error(with(to_message(RoleError{"stage 1", "x"}, 1), "message", 5)),
                    Catch::Contains("\"message\""));
  CHECK_THROWS_WITH(read_state_reply(to_message(StateReply{{"a", "b"}, {}}, 1, {zeros({1})})),
                    Catch::Contains("names 2 tensors but carries 1"));
  CHECK_THROWS_AS(read_empty(with(Message(PipelineKind::Abort, 1), "x", 1)), ControlError);
  CHECK_NOTHROW(read_empty(Message(PipelineKind::Abort, 1)));
}

TEST_CASE("only coordinator commands are marked as such", "[control]") {
  for (MessageKind kind : {PipelineKind::StepBegin, PipelineKind::OptimizerStep,
                           PipelineKind::Abort, MessageKind::Shutdown, PipelineKind::FetchState,
                           PipelineKind::StagePackage, MessageKind::Start}) {
    CHECK(is_coordinator_command(kind));
  }
  for (MessageKind kind :
       {PipelineKind::Activation, PipelineKind::Gradient, PipelineKind::StageDone,
        MessageKind::RoleError, MessageKind::State, MessageKind::PeerLost}) {
    CHECK_FALSE(is_coordinator_command(kind));
  }
}
