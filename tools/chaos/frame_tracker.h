#pragma once
// FrameTracker follows a byte stream of pipit frames (comm/frame.h) and says where each byte
// lies: the fixed header, the frame's JSON header, or in the body, its safetensors length,
// its safetensors JSON header or tensor data. The chaos proxy uses it to land a cut or a
// flipped byte in a chosen part of a frame. It reads lengths as they come and allocates
// nothing, so a malformed stream only confuses it.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

#include "comm/frame.h"
#include "comm/message.h"

namespace pipit::chaos {

enum class Region { FixedHeader, FrameJson, BodyLength, TensorJson, TensorData };

inline const char* region_name(Region region) {
  // In Region's order.
  static constexpr const char* kNames[] = {"fixed header", "frame JSON header",
                                           "safetensors length", "safetensors JSON header",
                                           "tensor data"};
  static_assert(std::size(kNames) == static_cast<size_t>(Region::TensorData) + 1);
  return kNames[static_cast<size_t>(region)];
}

struct BytePosition {
  Region region = Region::FixedHeader;
  uint64_t offset = 0;  // within the region
  uint64_t length = 0;  // of the region
  int kind = -1;        // the frame's MessageKind; -1 before its byte 6 has passed
  uint64_t frame = 0;   // frames seen before this one on the stream
};

inline std::string kind_name(int kind) {
  if (kind < 0) return "?";
  const char* name = message_kind_name(static_cast<MessageKind>(kind));
  return name ? name : "kind " + std::to_string(kind);
}

class FrameTracker {
 public:
  // Where `byte`, the next byte of the stream as its sender wrote it, lies.
  BytePosition feed(uint8_t byte) {
    const BytePosition here = position();
    absorb(byte);
    return here;
  }
  // The first frame's JSON header (the Hello: it names the dialing side), once complete.
  const std::string& first_json() const { return first_json_; }

 private:
  BytePosition position() const {
    BytePosition p;
    p.kind = pos_ > 6 ? fixed_[6] : -1;
    p.frame = frames_;
    if (pos_ < kFrameHeaderSize) {
      p.region = Region::FixedHeader, p.offset = pos_, p.length = kFrameHeaderSize;
      return p;
    }
    const uint64_t in_json = pos_ - kFrameHeaderSize;
    if (in_json < json_) {
      p.region = Region::FrameJson, p.offset = in_json, p.length = json_;
      return p;
    }
    const uint64_t in_body = in_json - json_;
    if (in_body < 8) {
      p.region = Region::BodyLength, p.offset = in_body, p.length = 8;
    } else if (in_body < 8 + tensor_json_) {
      p.region = Region::TensorJson, p.offset = in_body - 8, p.length = tensor_json_;
    } else {
      p.region = Region::TensorData, p.offset = in_body - 8 - tensor_json_;
      p.length = body_ - 8 - tensor_json_;
    }
    return p;
  }

  static uint64_t little_endian(const uint8_t* bytes, int n) {
    uint64_t value = 0;
    for (int i = n - 1; i >= 0; --i) value = value << 8 | bytes[i];
    return value;
  }

  void absorb(uint8_t byte) {
    if (pos_ < kFrameHeaderSize) {
      fixed_[pos_] = byte;
      if (pos_ + 1 == kFrameHeaderSize) {
        json_ = little_endian(fixed_ + 8, 4);
        body_ = little_endian(fixed_ + 16, 8);
        tensor_json_ = 0;
      }
    } else if (pos_ - kFrameHeaderSize < json_) {
      if (frames_ == 0 && first_json_.size() < 4096) first_json_ += static_cast<char>(byte);
    } else {
      const uint64_t in_body = pos_ - kFrameHeaderSize - json_;
      if (in_body < 8) {
        length_[in_body] = byte;
        if (in_body == 7) {
          const uint64_t n = little_endian(length_, 8);
          tensor_json_ = body_ >= 8 && n <= body_ - 8 ? n : 0;
        }
      }
    }
    ++pos_;
    if (pos_ >= kFrameHeaderSize && pos_ - kFrameHeaderSize == json_ + body_) {
      pos_ = 0;
      ++frames_;
    }
  }

  uint64_t pos_ = 0;  // offset in the current frame
  uint8_t fixed_[kFrameHeaderSize] = {};
  uint8_t length_[8] = {};
  uint64_t json_ = 0, body_ = 0, tensor_json_ = 0;
  uint64_t frames_ = 0;
  std::string first_json_;
};

}  // namespace pipit::chaos
