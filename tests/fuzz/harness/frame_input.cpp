#include "tests/fuzz/harness/frame_input.h"

#include <algorithm>

#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {

std::optional<FrameInput> split_frame_input(const uint8_t* data, size_t size) {
  if (size < kFrameHeaderSize) return std::nullopt;  // a reader waits for all of it
  FrameInput frame;
  // As an MPI rank reads it: frames that leave their tensors' bytes out of the checksum too.
  FrameLimits limits;
  limits.accept_unchecked_tensor_bytes = true;
  if (!refuses_only_with<FrameError>("decode_frame_header",
                                     [&] { frame.header = decode_frame_header(data, limits); })) {
    return std::nullopt;
  }
  std::string_view rest(reinterpret_cast<const char*>(data) + kFrameHeaderSize,
                        size - kFrameHeaderSize);
  frame.header.header_length =
      static_cast<uint32_t>(std::min<size_t>(frame.header.header_length, rest.size()));
  frame.json = rest.substr(0, frame.header.header_length);
  rest.remove_prefix(frame.header.header_length);
  frame.header.body_length = std::min<uint64_t>(frame.header.body_length, rest.size());
  frame.body = rest.substr(0, frame.header.body_length);
  // A frame whose checksum leaves the tensors out needs its body's prefix to find them: a
  // reader refuses a malformed one, as it would any.
  if (!refuses_only_with<FrameError>("frame_checksum", [&] {
        frame.header.checksum = frame_checksum(frame.header, frame.json, frame.body);
      })) {
    return std::nullopt;
  }
  return frame;
}

}  // namespace pipit::fuzz
