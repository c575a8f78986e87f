#pragma once
// Fuzz bytes read as one frame off a connection: the fixed header decoded by the real
// decoder (accepting frames flagged kFrameTensorBytesUnchecked, as MPI ranks do), then the
// JSON header and the body. Announced lengths are taken as far as the input
// reaches, and beyond it as if the peer had announced what the input holds, so that a
// mutation which changes the JSON's length still makes a frame some peer could send. The
// checksum is set to the one the adjusted frame needs, for the same reason: a CRC is no
// secret, any peer can send a frame that passes it, and without this nearly every mutation
// would stop at the checksum. (The frame harness checks that a wrong checksum is refused.)
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "comm/frame.h"

namespace pipit::fuzz {

struct FrameInput {
  FrameHeader header;  // lengths and checksum as adjusted
  std::string_view json, body;
};

// Nothing when the input is shorter than a fixed header or the header is refused (with a
// FrameError: anything else is a Finding).
std::optional<FrameInput> split_frame_input(const uint8_t* data, size_t size);

}  // namespace pipit::fuzz
