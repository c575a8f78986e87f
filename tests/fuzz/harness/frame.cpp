// The frame harness: bytes as they arrive on a connection, decoded as FrameReader does
// (the fixed header, the JSON header, the body's prefix, the planned tensors filled in
// place, the checksum) and as decode_frame_payload does in one call. Both must agree, refuse only
// with FrameError (the reader catches nothing else), and an accepted frame must re-encode to the
// same message. The message's meta then goes through the typed reader of its kind.
#include <algorithm>
#include <cstring>
#include <optional>

#include "comm/frame.h"
#include "comm/handshake.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"
#include "ps/messages.h"
#include "ps/package.h"
#include "tests/fuzz/harness/check.h"
#include "tests/fuzz/harness/frame_input.h"

namespace pipit::fuzz {
namespace {

// The message FrameReader would hand over, or nothing when it refuses the frame.
std::optional<Message> read_in_steps(const FrameHeader& header, std::string_view json,
                                     std::string_view body) {
  std::optional<Message> message;
  refuses_only_with<FrameError>("the frame reader's steps", [&] {
    std::vector<Tensor> tensors;
    std::string_view prefix_bytes;
    if (header.body_length > 0) {
      // The reader always takes 8 bytes here, even of a shorter body.
      uint8_t first8[8] = {};
      std::memcpy(first8, body.data(), std::min<size_t>(8, body.size()));
      const size_t prefix = frame_body_prefix_length(header, first8);
      require(prefix >= 8 && prefix <= body.size(),
              "frame_body_prefix_length returned a prefix outside the body");
      prefix_bytes = body.substr(0, prefix);
      tensors = plan_frame_body(header, prefix_bytes);
      size_t at = prefix;
      for (Tensor& t : tensors) {
        require(t.defined() && t.is_contiguous(), "plan_frame_body returned an unusable tensor");
        require(t.nbytes() <= body.size() - at, "plan_frame_body's tensors overrun the body");
        if (t.nbytes() > 0) std::memcpy(t.raw_data(), body.data() + at, t.nbytes());
        at += t.nbytes();
      }
      require(at == body.size(), "plan_frame_body's tensors leave body bytes unread");
    }
    verify_frame_checksum(header, json, prefix_bytes, tensors);
    message = decode_frame_message(header, json, std::move(tensors));
  });
  return message;
}

// Reads the meta with the typed reader of the message's kind; an accepted meta must be
// exactly what writing the typed value back produces.
void read_typed(const Message& message) {
  std::optional<Message> rewritten;
  // Data and stage packages have harnesses of their own.
  const auto typed = [&] {
    const MessageKind kind = message.kind;
    if (kind == PipelineKind::StepBegin) {
      rewritten = to_message(read_step_begin(message), message.step);
    } else if (kind == PipelineKind::OptimizerStep) {
      rewritten = to_message(read_optimizer_step(message), message.step);
    } else if (kind == PipelineKind::StageDone) {
      rewritten = to_message(read_stage_done(message), message.step);
    } else if (kind == MessageKind::RoleError) {
      rewritten = to_message(read_role_error(message), message.step);
    } else if (kind == MessageKind::State) {
      rewritten = to_message(read_state_reply(message), message.step, message.tensors);
    } else if (kind == MessageKind::PeerLost) {
      rewritten = to_message(read_peer_lost(message));
    } else if (kind == PipelineKind::RemapPrepare) {
      rewritten = to_message(read_remap_prepare(message), message.step);
    } else if (kind == PipelineKind::LayerTransfer) {
      rewritten =
          to_message(read_layer_transfer(message), message.step, message.chunk, message.tensors);
    } else if (kind == PsKind::Parameters) {
      rewritten = to_message(read_ps_parameters(message), message.tensors);
    } else if (kind == PsKind::Push) {
      rewritten = to_message(read_ps_push(message), message.tensors);
    } else if (kind == PsKind::Error) {
      rewritten = to_message(read_ps_error(message));
    } else if (kind == PsKind::Package) {  // its tensors come back in name order: read only
      read_ps_package(message);
      rewritten = message;
    } else if (kind == MessageKind::Hello) {
      rewritten = std::visit([](const auto& m) { return to_message(m); }, read_handshake(message));
    } else if (kind == PipelineKind::Abort || kind == MessageKind::Shutdown ||
               kind == PipelineKind::FetchState || kind == PipelineKind::OptimizerDone ||
               kind == MessageKind::Ready || kind == MessageKind::Start ||
               kind == MessageKind::Heartbeat || kind == PipelineKind::RemapReady ||
               kind == PipelineKind::RemapCommit || kind == PipelineKind::RemapDone ||
               kind == PsKind::Join || kind == PsKind::Leave) {
      read_empty(message);
      rewritten = message;
    }
  };
  if (!refuses_only_with<ControlError>("the typed control reader", typed) || !rewritten) return;
  require(rewritten->meta == message.meta,
          "a typed control reader accepted a meta that it does not write back the same: " +
              message.meta.dump() + " became " + rewritten->meta.dump());
}

}  // namespace

bool fuzz_frame(const uint8_t* data, size_t size) {
  const std::optional<FrameInput> frame = split_frame_input(data, size);
  if (!frame) return false;
  const FrameHeader& header = frame->header;
  const std::string_view json = frame->json, body = frame->body;
  if (header.flags & kFrameTensorBytesUnchecked) {
    require(
        !refuses_only_with<FrameError>("decode_frame_header", [&] { decode_frame_header(data); }),
        "a TCP reader accepts a frame that leaves its tensors' bytes unchecked");
  }

  FrameHeader corrupted = header;
  corrupted.checksum ^= 1;
  require(!refuses_only_with<FrameError>("decode_frame_payload",
                                         [&] { decode_frame_payload(corrupted, json, body); }),
          "decode_frame_payload accepts a frame with a wrong checksum");

  std::optional<Message> whole;
  refuses_only_with<FrameError>("decode_frame_payload",
                                [&] { whole = decode_frame_payload(header, json, body); });
  const std::optional<Message> stepwise = read_in_steps(header, json, body);
  require(whole.has_value() == stepwise.has_value(),
          whole ? "the reader's steps refuse a frame decode_frame_payload accepts"
                : "the reader's steps accept a frame decode_frame_payload refuses");
  if (!whole) return false;
  require(same_message(*whole, *stepwise),
          "decode_frame_payload and the reader's steps decode different messages");

  Message back;
  must_not_throw("re-encoding a decoded frame and decoding it again", [&] {
    const std::string again = encode_frame(*whole);
    const FrameHeader header2 = decode_frame_header(reinterpret_cast<const uint8_t*>(again.data()));
    const std::string_view rest2 = std::string_view(again).substr(kFrameHeaderSize);
    back = decode_frame_payload(header2, rest2.substr(0, header2.header_length),
                                rest2.substr(header2.header_length));
  });
  require(same_message(back, *whole), "a decoded frame does not survive re-encoding");
  read_typed(*whole);
  return true;
}

std::vector<std::string> frame_seeds() {
  std::vector<std::string> seeds;
  seeds.push_back(encode_frame(Message(MessageKind::Heartbeat, 0)));
  seeds.push_back(encode_frame(to_message(StepBegin{true, 4, true, false, true}, 7)));
  seeds.push_back(encode_frame(to_message(OptimizerStep{0.01, 0.5, false}, 7)));
  seeds.push_back(encode_frame(
      to_message(StageDone{12,
                           3.5,
                           {{0, 1, 0, 10.0, 20.5}, {1, 1, 1, 21, 40}, {1, 1, 3, 40, 45}},
                           {30.5, 12},
                           {{4, 10.5, 20.25, 512, 4096}}},
                 7)));
  seeds.push_back(encode_frame(to_message(RemapPrepare{{3, 2}, {2, 3}}, 8)));
  seeds.push_back(encode_frame(to_message(
      LayerTransfer{1, {{2, {{"type", "Linear"}, {"in", 2}, {"out", 2}}, {"2.weight"}, {}}}}, 8, 0,
      {ones({2, 2})})));
  seeds.push_back(encode_frame(to_message(Hello{1, "a1b2", "session-7"})));
  // Data frames: activations of several dtypes, an empty tensor, and a weights reply.
  Message activation(PipelineKind::Activation, 3, 1, 2,
                     {from_vector<float>({1, -2, 3.5f, 0, 1e-30f, -0.0f}, {2, 3}),
                      from_vector<int64_t>({5, -7}, {2}), zeros({0, 4}),
                      from_vector<float>({0.25f, 8}, {2}).to(DType::bf16)});
  seeds.push_back(encode_frame(activation));
  seeds.push_back(encode_frame(to_message(StateReply{{"0.weight"}, {"step"}}, 9,
                                          {ones({2, 2}), from_vector<int64_t>({4}, {})})));
  // Parameter-server messages.
  seeds.push_back(
      encode_frame(to_message(PsPush{3, {"0.weight", "0.bias"}, true},
                              {ones({2, 2}).to(DType::bf16), ones({2}).to(DType::bf16)})));
  seeds.push_back(encode_frame(to_message(PsParameters{4, {"0.weight"}}, {ones({2, 2})})));
  seeds.push_back(encode_frame(to_message(PsError{"refused"})));
  PsPackage package;
  package.role = "worker";
  package.config.workers = 2;
  package.model = {{"type", "Linear"}, {"in", 2}, {"out", 2}};
  package.shards = {"127.0.0.1:7001"};
  package.inputs = ones({4, 2});
  package.targets = zeros({4, 2});
  package.batch = 2;
  package.steps = 3;
  seeds.push_back(encode_frame(to_message(package)));
  return seeds;
}

}  // namespace pipit::fuzz
