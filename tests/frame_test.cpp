// The frame codec: messages survive a round trip bit for bit, the layout is the documented
// one, and every malformed or oversized frame is refused with an error naming what was wrong.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "codec/safetensors.h"
#include "comm/frame.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"

using namespace pipit;
using nlohmann::json;

namespace {

// Decodes a frame as a reader would: the fixed header, then what it announces.
Message decode(const std::string& frame, const FrameLimits& limits = {}) {
  REQUIRE(frame.size() >= kFrameHeaderSize);
  const FrameHeader header =
      decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()), limits);
  const std::string_view rest = std::string_view(frame).substr(kFrameHeaderSize);
  return decode_frame_payload(header, rest.substr(0, header.header_length),
                              rest.substr(std::min<size_t>(header.header_length, rest.size())));
}

Message payload(const std::string& json_header, const std::string& body = "") {
  FrameHeader header;
  header.kind = PipelineKind::Activation;
  header.header_length = static_cast<uint32_t>(json_header.size());
  header.body_length = body.size();
  header.checksum = frame_checksum(header, json_header, body);
  return decode_frame_payload(header, json_header, body);
}

// A safetensors body laid out in exactly the given order.
std::string body_of(const OrderedTensors& tensors) {
  std::string out = encode_safetensors_header(tensors);
  for (const auto& [name, t] : tensors) {
    out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

void expect_frame_error(const std::function<void()>& decode_bad, const std::string& fragment) {
  INFO("expected a FrameError mentioning: " << fragment);
  CHECK_THROWS_AS(decode_bad(), FrameError);
  CHECK_THROWS_WITH(decode_bad(), Catch::Contains(fragment));
}

void check_same(const Message& out, const Message& in) {
  CHECK(out.kind == in.kind);
  CHECK(out.step == in.step);
  CHECK(out.microbatch == in.microbatch);
  CHECK(out.chunk == in.chunk);
  CHECK(out.meta == in.meta);
  REQUIRE(out.tensors.size() == in.tensors.size());
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    INFO("tensor " << i);
    CHECK(out.tensors[i].shape() == in.tensors[i].shape());
    CHECK(out.tensors[i].dtype() == in.tensors[i].dtype());
    CHECK(out.tensors[i].is_contiguous());
    CHECK(out.tensors[i].to_vector<double>() == in.tensors[i].to_vector<double>());
  }
}

Message three_tensors() {
  Message m(PipelineKind::Gradient, 7, 3, 1,
            {from_vector<float>({1.5f, -2.25f, 3e8f, 0.0f, 1e-30f, -7.0f}, {2, 3}),
             from_vector<int64_t>({int64_t(1) << 50, -3, 0}),
             from_vector<double>({3.141592653589793, -1e-300})});
  return m;
}

std::string valid_frame() {
  return encode_frame(three_tensors());
}

}  // namespace

TEST_CASE("frame round trip without tensors keeps the fields and meta", "[frame]") {
  Message in(PipelineKind::StepBegin, int64_t(1) << 40, -2, 5);
  in.meta = {{"train", true}, {"microbatches", 4}, {"nested", {{"a", {1, 2.5, nullptr}}}}};
  const std::string frame = encode_frame(in);
  const Message out = decode(frame);
  check_same(out, in);
  CHECK(out.from == 0);
  // No tensors: no body at all.
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  CHECK(header.body_length == 0);
  CHECK(frame.size() == kFrameHeaderSize + header.header_length);
}

TEST_CASE("frame round trip with one and three tensors of f32, i64 and f64", "[frame]") {
  check_same(
      decode(encode_frame(
          Message(PipelineKind::Activation, 1, 0, 0, {from_vector<float>({1, 2, 3, 4}, {2, 2})}))),
      Message(PipelineKind::Activation, 1, 0, 0, {from_vector<float>({1, 2, 3, 4}, {2, 2})}));
  Message in = three_tensors();
  in.meta = {{"note", "gradients"}};
  check_same(decode(encode_frame(in)), in);
}

TEST_CASE("frame sends a non-contiguous tensor's values in row-major order", "[frame]") {
  const Tensor strided = transpose(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  REQUIRE_FALSE(strided.is_contiguous());
  Message in(PipelineKind::Activation, 2, 1, 0, {strided, from_vector<double>({9.0})});
  const Message out = decode(encode_frame(in));
  check_same(out, in);
  CHECK(out.tensors[0].to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("frame keeps tensor positions past ten and around empty tensors", "[frame]") {
  // Names "10" and "11" sort before "2": positions must come from the numbers.
  Message in(PipelineKind::Activation, 3);
  for (int i = 0; i < 12; ++i) {
    in.tensors.push_back(i == 4 || i == 5 ? Tensor::empty({0, 3}) : full({i + 1}, i, {DType::i32}));
  }
  check_same(decode(encode_frame(in)), in);
}

TEST_CASE("frame body is a safetensors blob of tensors named by position", "[frame]") {
  const std::string frame = valid_frame();
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  const std::string body = frame.substr(kFrameHeaderSize + header.header_length);
  const StateDict tensors = decode_safetensors(body.data(), body.size(), "frame body");
  REQUIRE(tensors.size() == 3);
  CHECK(tensors.at("0").dtype() == DType::f32);
  CHECK(tensors.at("1").dtype() == DType::i64);
  CHECK(tensors.at("2").dtype() == DType::f64);
}

TEST_CASE("frame fixed header has the documented little-endian layout", "[frame]") {
  const std::string frame = valid_frame();
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(frame[i]); };
  CHECK(frame.substr(0, 4) == "PIPT");
  CHECK(byte(4) == 3);
  CHECK(byte(5) == 0);
  CHECK(byte(6) == static_cast<uint8_t>(PipelineKind::Gradient));
  CHECK(byte(7) == 0);
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  CHECK(header.kind == PipelineKind::Gradient);
  uint32_t header_length = 0;
  for (size_t i = 0; i < 4; ++i) header_length |= uint32_t{byte(8 + i)} << (8 * i);
  CHECK(header_length == header.header_length);
  uint32_t checksum = 0;
  for (size_t i = 0; i < 4; ++i) checksum |= uint32_t{byte(12 + i)} << (8 * i);
  CHECK(checksum == header.checksum);
  CHECK(checksum == frame_checksum(header, frame.substr(kFrameHeaderSize, header.header_length),
                                   frame.substr(kFrameHeaderSize + header.header_length)));
  uint64_t body_length = 0;
  for (size_t i = 0; i < 8; ++i) body_length |= uint64_t{byte(16 + i)} << (8 * i);
  CHECK(body_length == header.body_length);
  CHECK(frame.size() == kFrameHeaderSize + header.header_length + header.body_length);
  CHECK(json::parse(frame.substr(kFrameHeaderSize, header.header_length)) ==
        json{{"step", 7}, {"microbatch", 3}, {"chunk", 1}, {"meta", json::object()}});
}

TEST_CASE("encode_frame is the concatenation of encode_frame_parts", "[frame]") {
  Message in = three_tensors();
  const Tensor strided = transpose(from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}), 0, 1);
  in.tensors.push_back(strided);
  const EncodedFrame parts = encode_frame_parts(in);
  std::string joined = parts.prefix;
  for (const auto& [data, bytes] : parts.tensor_bytes) {
    joined.append(static_cast<const char*>(data), bytes);
  }
  CHECK(joined == encode_frame(in));
  CHECK(parts.size() == joined.size());
  REQUIRE(parts.tensor_bytes.size() == 4);
  // Contiguous tensors are sent from where they lie; the strided one from a kept copy.
  for (size_t i = 0; i < 3; ++i) CHECK(parts.tensor_bytes[i].first == in.tensors[i].raw_data());
  CHECK(parts.tensor_bytes[3].first != strided.raw_data());
  CHECK(parts.tensor_bytes[3].second == strided.nbytes());
  bool kept = false;
  for (const Tensor& t : parts.keep_alive)
    kept = kept || t.raw_data() == parts.tensor_bytes[3].first;
  CHECK(kept);
  CHECK(encode_frame_parts(Message(MessageKind::Heartbeat, 0)).tensor_bytes.empty());
}

TEST_CASE("encode_frame refuses an undefined tensor and meta that is not UTF-8", "[frame]") {
  Message in(PipelineKind::Activation, 1, 0, 0, {from_vector<float>({1}), Tensor()});
  CHECK_THROWS_WITH(encode_frame(in), Catch::Contains("tensor 1 is undefined"));
  Message bad_meta(MessageKind::RoleError, 1);
  bad_meta.meta = {{"message", "\xff"}};
  CHECK_THROWS_WITH(encode_frame(bad_meta),
                    Catch::Contains("RoleError") && Catch::Contains("meta cannot be written"));
}

TEST_CASE("frame header rejects bad magic, version, kind and flags", "[frame]") {
  const auto with_byte = [](size_t index, uint8_t value) {
    std::string frame = valid_frame();
    frame[index] = static_cast<char>(value);
    return frame;
  };
  expect_frame_error([&] { decode(with_byte(0, 'X')); }, "magic");
  expect_frame_error([&] { decode(with_byte(4, 1)); }, "version 1");
  // Version 2's RoleError (then StageError) carried a stage number, not the role's name.
  expect_frame_error([&] { decode(with_byte(4, 2)); }, "unsupported protocol version 2");
  expect_frame_error([&] { decode(with_byte(5, 1)); }, "version 259");
  expect_frame_error([&] { decode(with_byte(6, 0)); }, "unknown message kind 0");
  expect_frame_error([&] { decode(with_byte(6, 200)); }, "unknown message kind 200");
  expect_frame_error([&] { decode(with_byte(7, 1)); }, "flags");
}

TEST_CASE("a frame with any byte changed fails, most by its checksum", "[frame]") {
  Message message(PipelineKind::Activation, 5, 1, 2, {from_vector<float>({1, 2, 3, 4})});
  message.meta = {{"note", "x"}};
  const std::string frame = encode_frame(message);
  int by_checksum = 0;
  for (size_t i = 0; i < frame.size(); ++i) {
    for (const uint8_t mask : {0x01, 0x80}) {
      std::string changed = frame;
      changed[i] = static_cast<char>(changed[i] ^ mask);
      INFO("byte " << i << " mask " << int(mask));
      try {
        decode(changed);
        FAIL("a changed frame decoded");
      } catch (const FrameError& e) {
        by_checksum += std::string(e.what()).find("checksum") != std::string::npos;
      } catch (const Error&) {
        // e.g. a length field now claims more bytes than the frame has (a test artefact:
        // a reader would wait for them and then fail the checksum)
      }
    }
  }
  // Every byte of the JSON header and the tensors, and the checksum itself, is covered.
  CHECK(by_checksum > static_cast<int>(frame.size()));
}

TEST_CASE("a frame may leave its tensors' bytes out of the checksum where the reader allows it",
          "[frame]") {
  const Message message = three_tensors();
  const EncodedFrame parts = encode_frame_parts(message, /*checksum_tensor_bytes=*/false);
  const std::string frame = parts.joined();
  CHECK(static_cast<uint8_t>(frame[7]) == kFrameTensorBytesUnchecked);
  FrameLimits mpi;
  mpi.accept_unchecked_tensor_bytes = true;
  // The checksum is that of the frame without its tensors' bytes.
  const FrameHeader header =
      decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()), mpi);
  const std::string_view json =
      std::string_view(frame).substr(kFrameHeaderSize, header.header_length);
  const size_t body_begin = kFrameHeaderSize + header.header_length;
  const std::string_view prefix =
      std::string_view(frame).substr(body_begin, parts.prefix.size() - body_begin);
  Crc32c crc = frame_checksum_begin(header, json);
  crc.update(prefix);
  CHECK(crc.value() == header.checksum);

  // A TCP reader (default limits) refuses it by its flag before reading further.
  expect_frame_error([&] { decode(frame); }, "leave the tensors' bytes out of the checksum");
  check_same(decode(frame, mpi), message);
  // Its headers stay covered: any byte of the JSON header or the body's prefix changed fails.
  for (size_t i = kFrameHeaderSize; i < parts.prefix.size(); ++i) {
    std::string changed = frame;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    INFO("byte " << i);
    CHECK_THROWS_AS(decode(changed, mpi), FrameError);
  }
  // A tensor byte changed is the transport's to prevent: the frame decodes with the new value.
  std::string changed = frame;
  changed.back() = static_cast<char>(changed.back() ^ 0x80);
  const Message got = decode(changed, mpi);
  CHECK(got.tensors[2].to_vector<double>()[1] != message.tensors[2].to_vector<double>()[1]);
  // With the tensors checked (the default), the same change fails by the checksum.
  std::string checked = encode_frame(message);
  checked.back() = static_cast<char>(checked.back() ^ 0x80);
  expect_frame_error([&] { decode(checked, mpi); }, "checksum");
  // Other flag bits stay unknown, whatever the limits.
  std::string other = frame;
  other[7] = static_cast<char>(0x02);
  expect_frame_error([&] { decode(other, mpi); }, "unknown flags 0x2");
}

TEST_CASE("frame header rejects lengths over the limits", "[frame]") {
  const std::string frame = valid_frame();
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  FrameLimits limits;
  limits.max_header_bytes = header.header_length - 1;
  expect_frame_error([&] { decode(frame, limits); }, "header_length");
  limits = FrameLimits();
  limits.max_body_bytes = header.body_length - 1;
  expect_frame_error([&] { decode(frame, limits); }, "body_length");
  // The defaults refuse a body announced at 2^63 bytes before anything is allocated.
  std::string huge = frame;
  huge[23] = static_cast<char>(0x80);
  expect_frame_error([&] { decode(huge); }, "body_length 92233720368547");
}

TEST_CASE("frame payload rejects malformed JSON headers", "[frame]") {
  expect_frame_error([] { payload(R"({"step": 1, "microbatch")"); }, "not valid JSON");
  expect_frame_error([] { payload("[1, 2]"); }, "not an object");
  expect_frame_error([] { payload(R"({"microbatch": 0, "chunk": 0, "meta": {}})"); },
                     "lacks \"step\"");
  expect_frame_error([] { payload(R"({"step": "1", "microbatch": 0, "chunk": 0, "meta": {}})"); },
                     "\"step\" is \"1\", not an integer");
  expect_frame_error([] { payload(R"({"step": 1.5, "microbatch": 0, "chunk": 0, "meta": {}})"); },
                     "\"step\"");
  expect_frame_error(
      [] { payload(R"({"step": 18446744073709551615, "microbatch": 0, "chunk": 0, "meta": {}})"); },
      "\"step\"");
  expect_frame_error(
      [] { payload(R"({"step": 1, "microbatch": 4294967296, "chunk": 0, "meta": {}})"); },
      "\"microbatch\"");
  expect_frame_error([] { payload(R"({"step": 1, "microbatch": 0, "chunk": null, "meta": {}})"); },
                     "\"chunk\"");
  expect_frame_error([] { payload(R"({"step": 1, "microbatch": 0, "chunk": 0})"); },
                     "lacks \"meta\"");
  expect_frame_error(
      [] { payload(R"({"step": 1, "microbatch": 0, "chunk": 0, "meta": {}, "from": 2})"); },
      "unknown field \"from\"");
  CHECK(payload(R"({"step": -1, "microbatch": 0, "chunk": 0, "meta": [1]})").meta == json{1});
}

TEST_CASE("frame payload rejects sizes that differ from the header", "[frame]") {
  const std::string frame = valid_frame();
  // The header claims more body than was given.
  expect_frame_error([&] { decode(frame.substr(0, frame.size() - 1)); }, "body has");
  const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  const std::string json_header = frame.substr(kFrameHeaderSize, header.header_length);
  expect_frame_error([&] { decode_frame_payload(header, json_header.substr(1), ""); },
                     "JSON header has");
}

TEST_CASE("frame payload rejects bodies that are not position-named safetensors", "[frame]") {
  const std::string fields = R"({"step": 1, "microbatch": 0, "chunk": 0, "meta": {}})";
  expect_frame_error([&] { payload(fields, "not a safetensors blob"); }, "safetensors");
  std::string blob = body_of({{"0", from_vector<float>({1, 2})}});
  expect_frame_error([&] { payload(fields, blob.substr(0, blob.size() - 4)); }, "safetensors");

  const Tensor a = from_vector<float>({1, 2}), b = from_vector<double>({3});
  expect_frame_error([&] { payload(fields, body_of({{"1", a}, {"0", b}})); }, "out of order");
  expect_frame_error(
      [&] {
        payload(fields, body_of({{"0", a}, {"2", b}}));
      },
      "'2' is not one of \"0\"..\"1\"");
  expect_frame_error([&] { payload(fields, body_of({{"00", a}})); }, "'00'");
  expect_frame_error([&] { payload(fields, body_of({{"weight", a}})); }, "'weight'");
  expect_frame_error([&] { payload(fields, body_of({{"-0", a}})); }, "'-0'");

  // A bool byte other than 0 or 1 is not a bool: refused by position and element.
  Tensor flags = Tensor::empty({3}, DType::b8);
  std::memcpy(flags.raw_data(), "\x01\x00\x02", 3);
  expect_frame_error(
      [&] {
        payload(fields, body_of({{"0", a}, {"1", flags}}));
      },
      "body tensor '1': BOOL element 2 holds the byte 2, not 0 or 1");

  const Message out = payload(fields, body_of({{"0", a}, {"1", b}}));
  REQUIRE(out.tensors.size() == 2);
  CHECK(out.tensors[1].to_vector<double>() == std::vector<double>{3});
}

TEST_CASE("a data message's JSON header is the JSON library's, and reads the same either way",
          "[frame]") {
  // Data messages' headers are written and read without the library (comm/frame.cpp); the
  // bytes and the fields must be exactly the library's.
  const int kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();
  const int64_t kStepMin = std::numeric_limits<int64_t>::min(),
                kStepMax = std::numeric_limits<int64_t>::max();
  for (const auto& [step, microbatch, chunk] :
       std::vector<std::tuple<int64_t, int, int>>{{0, 0, 0},
                                                  {1, 3, 0},
                                                  {-1, -7, 12},
                                                  {kStepMin, kIntMin, kIntMin},
                                                  {kStepMax, kIntMax, kIntMax},
                                                  {1234567890123, 100, 9}}) {
    INFO("step " << step << ", microbatch " << microbatch << ", chunk " << chunk);
    const Message in(PipelineKind::Activation, step, microbatch, chunk, {ones({2})});
    const EncodedFrame frame = encode_frame_parts(in);
    const FrameHeader header =
        decode_frame_header(reinterpret_cast<const uint8_t*>(frame.prefix.data()));
    const std::string library = json{
        {"step", step},
        {"microbatch", microbatch},
        {"chunk", chunk},
        {"meta", json::object()}}.dump();
    CHECK(frame.prefix.substr(kFrameHeaderSize, header.header_length) == library);
    check_same(decode(frame.joined()), in);
  }
  // Forms the writer never makes go to the library, which reads or refuses them as before.
  const Message spaced = payload(R"({"chunk": 1, "meta": { }, "microbatch": 2, "step": 3})");
  CHECK((spaced.chunk == 1 && spaced.microbatch == 2 && spaced.step == 3));
  CHECK(spaced.meta == json::object());
  const Message minus_zero = payload(R"({"chunk":0,"meta":{},"microbatch":-0,"step":5})");
  CHECK((minus_zero.microbatch == 0 && minus_zero.step == 5));
  const Message reordered = payload(R"({"step":5,"chunk":1,"meta":{},"microbatch":2})");
  CHECK((reordered.chunk == 1 && reordered.microbatch == 2 && reordered.step == 5));
  expect_frame_error([] { payload(R"({"chunk":01,"meta":{},"microbatch":2,"step":3})"); },
                     "not valid JSON");
  expect_frame_error([] { payload(R"({"chunk":1,"meta":{},"microbatch":2,"step":3)"); },
                     "not valid JSON");
  expect_frame_error([] { payload(R"({"chunk":1,"meta":{},"microbatch":2,"step":3}x)"); },
                     "not valid JSON");
  expect_frame_error([] { payload(R"({"chunk":2147483648,"meta":{},"microbatch":2,"step":3})"); },
                     "\"chunk\"");
  expect_frame_error([] { payload(R"({"chunk":1,"meta":{},"microbatch":2,"step":1e3})"); },
                     "\"step\"");
  expect_frame_error(
      [] { payload(R"({"chunk":1,"meta":{},"microbatch":2,"step":9223372036854775808})"); },
      "\"step\"");
}
