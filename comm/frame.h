#pragma once
// The wire format of networked communicators: one Message per frame.
//
//   offset size  field           (integers little-endian)
//        0    4  magic           kFrameMagic, the bytes "PIPT"
//        4    2  version         kProtocolVersion
//        6    1  kind            a MessageKind
//        7    1  flags           bit 0 (kFrameTensorBytesUnchecked): the checksum leaves out
//                                the tensors' bytes; every other bit 0
//        8    4  header_length   bytes of the JSON header
//       12    4  checksum        CRC-32C of the frame's other bytes: fixed header bytes 0-11
//                                and 16-23, then the JSON header, then the body
//       16    8  body_length     bytes of the body
//       24       JSON header     {"step": int, "microbatch": int, "chunk": int, "meta": any}
//                body            empty without tensors, else a safetensors blob whose tensors
//                                are named "0".."n-1" and lie in that order
//
// `from` is not sent: the receiver knows which connection a frame came on. A reader takes the
// fixed header first, so it can refuse a frame by its lengths before allocating for it, and
// refuses a frame whose checksum does not match: a byte changed in transit is an error, not
// a silently different activation or weight. A transport that itself guarantees the bytes it
// delivers (MPI) may leave the tensors' bytes out of the checksum, which then covers the
// fixed header, the JSON header and the body's prefix; a reader refuses such frames unless
// its FrameLimits accept them, so over TCP every byte stays checked.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/crc32c.h"
#include "comm/message.h"

namespace pipit {

constexpr uint32_t kFrameMagic = 0x54504950;  // "PIPT" little-endian
constexpr uint16_t kProtocolVersion = 3;      // 2: the checksum field; 3: RoleError names its role
constexpr size_t kFrameHeaderSize = 24;
constexpr size_t kMaxJsonDepth = 32;  // nesting of a frame's JSON header
constexpr uint8_t kFrameTensorBytesUnchecked = 1;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kProtocolVersion;
  MessageKind kind = MessageKind::Heartbeat;
  uint8_t flags = 0;
  uint32_t header_length = 0;
  uint32_t checksum = 0;
  uint64_t body_length = 0;
};

// What a receiver accepts; a peer announcing more is refused before anything is allocated.
struct FrameLimits {
  size_t max_header_bytes = size_t{1} << 20;
  size_t max_body_bytes = size_t{1} << 31;
  bool accept_unchecked_tensor_bytes = false;  // frames flagged kFrameTensorBytesUnchecked
};

// A received frame is malformed or exceeds the limits: the connection it came on is not to be
// trusted further.
class FrameError : public Error {
 public:
  using Error::Error;
};

// A frame in pieces for a gathering write: `prefix` (fixed header, JSON header, the body's
// safetensors length and header), then each tensor's bytes in message order, read from where
// they lie. `keep_alive` holds every tensor those pointers refer to (contiguous host copies of
// tensors that were strided or on a device). The bytes are read at write time, so a sender
// must not modify the tensors in place until the frame is written.
struct EncodedFrame {
  std::string prefix;
  std::vector<std::pair<const void*, size_t>> tensor_bytes;
  std::vector<Tensor> keep_alive;

  size_t size() const;
  // The whole frame in one string: the prefix and the tensor bytes concatenated, after `lead`
  // (a transport's own routing bytes, so the frame is copied once).
  std::string joined(std::string_view lead = {}) const;
};

// `checksum_tensor_bytes` false: the frame is flagged kFrameTensorBytesUnchecked and its
// checksum leaves the tensors' bytes out.
EncodedFrame encode_frame_parts(const Message& message, bool checksum_tensor_bytes = true);
// encode_frame_parts(message).joined().
std::string encode_frame(const Message& message);

// Reads the kFrameHeaderSize bytes at `bytes`. Throws FrameError naming the field and value
// for a wrong magic, version, kind or flags field (kFrameTensorBytesUnchecked where `limits`
// do not accept it), or a length over `limits`.
FrameHeader decode_frame_header(const uint8_t* bytes, const FrameLimits& limits = {});
// The Message of a frame whose header decoded to `header`, from the header_length bytes of
// JSON and body_length bytes of body that followed it. Throws FrameError when the sizes do not
// match the header, the JSON lacks a field or has one of the wrong type, or the body is not
// a safetensors blob of tensors "0".."n-1" in order. The tensors own their memory.
Message decode_frame_payload(const FrameHeader& header, std::string_view json_header,
                             std::string_view body);

// The CRC-32C a frame with this fixed header (its checksum field aside), JSON header and body
// carries in its checksum field (flagged kFrameTensorBytesUnchecked: of the body's prefix
// only, its length read from the body, which throws FrameError if malformed).
uint32_t frame_checksum(const FrameHeader& header, std::string_view json_header,
                        std::string_view body);
// Throws FrameError naming the kind when `header.checksum` is not the CRC-32C of the frame
// whose JSON header, body prefix and tensors (their bytes, in order) these are.
void verify_frame_checksum(const FrameHeader& header, std::string_view json_header,
                           std::string_view body_prefix, const std::vector<Tensor>& tensors);
// The same check in steps, for a reader that checksums the body as it arrives, while it is
// still in cache: the CRC over the fixed header and JSON header, to update with the body
// prefix and the tensors' bytes in order (unless flagged kFrameTensorBytesUnchecked) and pass
// to require_frame_checksum.
Crc32c frame_checksum_begin(const FrameHeader& header, std::string_view json_header);
void require_frame_checksum(const FrameHeader& header, const Crc32c& crc);

// The same in steps, so a reader can receive tensor bytes straight into tensor memory:
// the first 8 body bytes give the length of the body's prefix (its safetensors length field
// and JSON header); plan_frame_body validates that prefix and returns the message's tensors,
// allocated and not yet filled, in message order, which is also the order their bytes follow
// the prefix in (empty tensors take none); decode_frame_message completes the Message. Each
// throws FrameError naming what is wrong.
size_t frame_body_prefix_length(const FrameHeader& header, const uint8_t* first8);
std::vector<Tensor> plan_frame_body(const FrameHeader& header, std::string_view body_prefix);
Message decode_frame_message(const FrameHeader& header, std::string_view json_header,
                             std::vector<Tensor> tensors);

}  // namespace pipit
