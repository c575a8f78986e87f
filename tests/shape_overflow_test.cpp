// Shapes from files, frames and callers are checked before anything is computed from them:
// every dim non-negative and the product of the nonzero dims within int64, so no stride or
// element count overflows, zeros in the shape or not. Each refusal names the shape.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "codec/safetensors.h"
#include "comm/frame.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"

using namespace pipit;

namespace {

constexpr int64_t k2p31 = int64_t{1} << 31, k2p40 = int64_t{1} << 40, k2p62 = int64_t{1} << 62;

// A safetensors blob holding one tensor "0" with the given JSON shape and no data bytes.
std::string empty_tensor_blob(const std::string& shape) {
  const std::string header =
      R"({"0":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,0]}})";
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header;
}

// The shapes that pass an overflow check that stops at a zero, written as JSON.
const char* const kHugeShapes[] = {
    "[0,4611686018427387904,4611686018427387904]",  // [0, 2^62, 2^62]
    "[1099511627776,1099511627776,0]",              // [2^40, 2^40, 0]
    "[4611686018427387904,0,4611686018427387904]",  // [2^62, 0, 2^62]
};

}  // namespace

TEST_CASE("shapes whose nonzero dims overflow int64 are refused wherever the zero lies",
          "[tensor][shape]") {
  for (const Shape& shape : {Shape{0, k2p62, k2p62}, Shape{k2p40, k2p40, 0}, Shape{k2p62, 0, k2p62},
                             Shape{k2p62, k2p62}}) {
    INFO(shape_str(shape));
    CHECK_THROWS_WITH(check_shape(shape, "test"),
                      Catch::StartsWith("test: shape " + shape_str(shape)) &&
                          Catch::Contains("too large") && Catch::Contains("overflows int64"));
    CHECK_THROWS_WITH(shape_numel(shape), Catch::Contains(shape_str(shape)));
    CHECK_THROWS_WITH(contiguous_strides(shape), Catch::Contains(shape_str(shape)));
    CHECK_THROWS_WITH(Tensor::empty(shape), Catch::StartsWith("empty: shape " + shape_str(shape)) &&
                                                Catch::Contains("too large"));
  }
  CHECK_THROWS_WITH(check_shape({3, -2}, "test"),
                    Catch::Equals("test: shape [3, -2] has a negative dimension -2"));
  CHECK_THROWS_WITH(Tensor::empty({0, -1}), Catch::Contains("negative dimension -1"));
}

TEST_CASE("shapes at the int64 limit still work, empty or not", "[tensor][shape]") {
  CHECK_NOTHROW(check_shape({}, "test"));
  CHECK_NOTHROW(check_shape({k2p31, 0, k2p31, 1}, "test"));  // 2^62 fits
  CHECK_THROWS(check_shape({k2p31, 0, k2p31, 2}, "test"));   // 2^63 does not
  CHECK_NOTHROW(check_shape({INT64_MAX, 0}, "test"));
  CHECK(shape_numel({0, k2p31, k2p31}) == 0);
  CHECK(shape_numel({k2p31, k2p31}) == int64_t{1} << 62);
  CHECK(shape_numel({}) == 1);
  CHECK(contiguous_strides({0, k2p31, k2p31}) == Shape{int64_t{1} << 62, k2p31, 1});
  CHECK(contiguous_strides({k2p31, k2p31, 0}) == Shape{0, 0, 1});
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});

  const Tensor empty = Tensor::empty({0, k2p31, k2p31});
  CHECK(empty.numel() == 0);
  CHECK(empty.nbytes() == 0);
  CHECK(empty.strides() == Shape{int64_t{1} << 62, k2p31, 1});
}

TEST_CASE("a tensor whose byte size overflows int64 is refused before allocating",
          "[tensor][shape]") {
  // 2^61 floats pass the element check but are 2^63 bytes: a wrapped size_t would have
  // allocated nothing for them.
  CHECK_THROWS_WITH(
      Tensor::empty({int64_t{1} << 61}),
      Catch::Contains("[2305843009213693952]") && Catch::Contains("size in bytes overflows int64"));
  CHECK_THROWS_WITH(Tensor::empty({int64_t{1} << 60}, DType::f64),
                    Catch::Contains("size in bytes overflows int64"));
}

TEST_CASE("safetensors headers with overflowing shapes are refused, empty or not",
          "[serialize][shape]") {
  for (const char* shape : kHugeShapes) {
    INFO(shape);
    const std::string blob = empty_tensor_blob(shape);
    CHECK_THROWS_WITH(decode_safetensors(blob.data(), blob.size(), "huge.safetensors"),
                      Catch::Contains("huge.safetensors") && Catch::Contains("tensor '0'") &&
                          Catch::Contains("too large"));
  }
  const std::string past_int64 = empty_tensor_blob("[0,9223372036854775808]");
  CHECK_THROWS_WITH(decode_safetensors(past_int64.data(), past_int64.size(), "big"),
                    Catch::Contains("exceeds int64"));
  // The same layout with a shape that fits decodes to an empty tensor of that shape.
  const std::string fits = empty_tensor_blob("[0,2147483648,2147483648]");
  const StateDict decoded = decode_safetensors(fits.data(), fits.size(), "fits");
  CHECK(decoded.at("0").shape() == Shape{0, k2p31, k2p31});
}

TEST_CASE("frames whose tensors have overflowing shapes are refused", "[comm][shape]") {
  const std::string json_header = R"({"step":0,"microbatch":0,"chunk":0,"meta":null})";
  for (const char* shape : kHugeShapes) {
    INFO(shape);
    const std::string body = empty_tensor_blob(shape);
    FrameHeader header;
    header.kind = PipelineKind::Activation;
    header.header_length = static_cast<uint32_t>(json_header.size());
    header.body_length = body.size();
    header.checksum = frame_checksum(header, json_header, body);
    CHECK_THROWS_AS(decode_frame_payload(header, json_header, body), FrameError);
    CHECK_THROWS_WITH(decode_frame_payload(header, json_header, body),
                      Catch::Contains("too large") && Catch::Contains("tensor '0'"));
  }
}

TEST_CASE("reshape refuses target shapes that overflow, zeros or -1 among them",
          "[autograd][shape]") {
  const Tensor empty = zeros({0});
  CHECK_THROWS_WITH(reshape(empty, {0, k2p62, k2p62}),
                    Catch::Contains("reshape") && Catch::Contains("too large"));
  CHECK_THROWS_WITH(reshape(empty, {k2p40, k2p40, 0, -1}), Catch::Contains("too large"));
  CHECK_THROWS_WITH(reshape(zeros({4}), {k2p62, k2p62, -1}), Catch::Contains("too large"));
  CHECK(reshape(empty, {0, k2p31, k2p31}).shape() == Shape{0, k2p31, k2p31});
  CHECK_THROWS_WITH(reshape(empty, {0, -1}), Catch::Contains("cannot reshape"));
  CHECK(reshape(zeros({2, 6}), {3, -1}).shape() == Shape{3, 4});
}
