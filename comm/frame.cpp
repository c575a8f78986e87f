#include "comm/frame.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>

#include "codec/crc32c.h"
#include "codec/json_depth.h"
#include "codec/plain_json.h"
#include "codec/safetensors.h"

namespace pipit {

namespace {

using json = nlohmann::json;

template <typename... Args>
void require(bool condition, const Args&... parts) {
  if (!condition) throw FrameError(detail::concat(parts...));
}

void put_le(std::string& out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const uint8_t* bytes, size_t count) {
  uint64_t value = 0;
  for (size_t i = 0; i < count; ++i) value |= uint64_t{bytes[i]} << (8 * i);
  return value;
}

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

void encode_frame_header(std::string& out, const FrameHeader& header) {
  put_le(out, header.magic, 4);
  put_le(out, header.version, 2);
  put_le(out, static_cast<uint8_t>(header.kind), 1);
  put_le(out, header.flags, 1);
  put_le(out, header.header_length, 4);
  put_le(out, header.checksum, 4);
  put_le(out, header.body_length, 8);
}

// Built for every frame, so without a string stream.
std::string describe(const FrameHeader& header) {
  return std::string("frame (") + message_kind_name(header.kind) + "): ";
}

// The canonical decimal index `name` stands for, when it is one of "0".."count-1".
bool parse_index(const std::string& name, size_t count, size_t* index) {
  if (name.empty() || (name.size() > 1 && name[0] == '0')) return false;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), *index);
  return error == std::errc() && end == name.data() + name.size() && *index < count;
}

template <typename T>
T integer_field(const json& fields, const char* name, const std::string& where) {
  require(fields.contains(name), where, "JSON header lacks \"", name, "\"");
  const json& value = fields[name];
  bool fits = false;
  if (value.is_number_unsigned()) {
    fits = value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    fits = v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max();
  }
  require(fits, where, "JSON header field \"", name, "\" is ", value.dump(),
          ", not an integer in [", std::numeric_limits<T>::min(), ", ",
          std::numeric_limits<T>::max(), "]");
  return value.get<T>();
}

// The body's tensors in message order, from its layout (tensors named "0".."n-1", those
// with bytes lying in index order).
std::vector<Tensor> order_body(SafetensorsLayout layout, const std::string& where) {
  std::vector<Tensor> tensors(layout.size());
  std::optional<size_t> last_with_data;
  for (SafetensorsEntry& e : layout) {
    size_t index = 0;
    require(parse_index(e.name, layout.size(), &index), where, "body tensor name '", e.name,
            "' is not one of \"0\"..\"", layout.size() - 1, "\"");
    // Empty tensors have no place in the data, so only those with bytes can be out of order.
    if (e.end > e.begin) {
      require(!last_with_data || index > *last_with_data, where, "body tensor '", e.name,
              "' lies after tensor '", last_with_data.value_or(0), "': tensors are out of order");
      last_with_data = index;
    }
    tensors[index] = std::move(e.tensor);
  }
  return tensors;
}

// The checksum starts with the fixed header's bytes other than the checksum field itself.
Crc32c fixed_header_crc(std::string_view fixed) {
  Crc32c crc;
  crc.update(fixed.substr(0, 12));
  crc.update(fixed.substr(16, 8));
  return crc;
}

// The JSON header of a data message, whose meta is an empty object, is written and read here
// without the JSON library: nearly every frame has one, and parsing it with the library cost
// more than the rest of decoding. Written exactly as the library writes it (keys sorted, no
// spaces); read only in that form, anything else going to the library, which gives the same
// fields for every header this accepts.
constexpr std::string_view kPlainChunk = "{\"chunk\":",
                           kPlainMicrobatch = ",\"meta\":{},\"microbatch\":",
                           kPlainStep = ",\"step\":", kPlainEnd = "}";

std::string plain_json_header(const Message& message) {
  std::string out;
  out.reserve(80);
  out += kPlainChunk;
  plain_json::put_integer(out, message.chunk);
  out += kPlainMicrobatch;
  plain_json::put_integer(out, message.microbatch);
  out += kPlainStep;
  plain_json::put_integer(out, message.step);
  out += kPlainEnd;
  return out;
}

bool read_plain_json_header(std::string_view text, int64_t* step, int* microbatch, int* chunk) {
  using plain_json::take_integer, plain_json::take_literal;
  constexpr int kIntMin = std::numeric_limits<int>::min(),
                kIntMax = std::numeric_limits<int>::max();
  return take_literal(text, kPlainChunk) && take_integer(text, kIntMin, kIntMax, chunk) &&
         take_literal(text, kPlainMicrobatch) && take_integer(text, kIntMin, kIntMax, microbatch) &&
         take_literal(text, kPlainStep) &&
         take_integer(text, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max(), step) &&
         text == kPlainEnd;
}

Crc32c header_crc(const FrameHeader& header, std::string_view json_header) {
  std::string fixed;
  encode_frame_header(fixed, header);
  Crc32c crc = fixed_header_crc(fixed);
  crc.update(json_header);
  return crc;
}

void require_checksum(const FrameHeader& header, uint32_t computed) {
  if (computed == header.checksum) return;
  throw FrameError(detail::concat(describe(header), "checksum ", hex(header.checksum),
                                  " does not match the frame's bytes (", hex(computed),
                                  "): they changed in transit"));
}

}  // namespace

uint32_t frame_checksum(const FrameHeader& header, std::string_view json_header,
                        std::string_view body) {
  Crc32c crc = header_crc(header, json_header);
  if ((header.flags & kFrameTensorBytesUnchecked) && !body.empty()) {
    uint8_t first8[8] = {};
    std::memcpy(first8, body.data(), std::min<size_t>(8, body.size()));
    body = body.substr(0, frame_body_prefix_length(header, first8));
  }
  crc.update(body);
  return crc.value();
}

Crc32c frame_checksum_begin(const FrameHeader& header, std::string_view json_header) {
  return header_crc(header, json_header);
}

void require_frame_checksum(const FrameHeader& header, const Crc32c& crc) {
  require_checksum(header, crc.value());
}

void verify_frame_checksum(const FrameHeader& header, std::string_view json_header,
                           std::string_view body_prefix, const std::vector<Tensor>& tensors) {
  Crc32c crc = frame_checksum_begin(header, json_header);
  crc.update(body_prefix);
  if (!(header.flags & kFrameTensorBytesUnchecked)) {
    for (const Tensor& t : tensors) crc.update(t.raw_data(), t.nbytes());
  }
  require_frame_checksum(header, crc);
}

size_t EncodedFrame::size() const {
  size_t total = prefix.size();
  for (const auto& [data, bytes] : tensor_bytes) total += bytes;
  return total;
}

EncodedFrame encode_frame_parts(const Message& message, bool checksum_tensor_bytes) {
  const std::string where =
      std::string("encode_frame (") + message_kind_name(message.kind) + " message): ";
  std::string json_header;
  try {
    if (message.meta.is_object() && message.meta.empty()) {
      json_header = plain_json_header(message);
    } else {
      json_header = json{{"step", message.step},
                         {"microbatch", message.microbatch},
                         {"chunk", message.chunk},
                         {"meta", message.meta}}
                        .dump();
    }
  } catch (const json::exception& e) {
    throw Error(where + "meta cannot be written as JSON: " + e.what());
  }
  PIPIT_CHECK(json_header.size() <= std::numeric_limits<uint32_t>::max(), where, "JSON header of ",
              json_header.size(), " bytes does not fit the 32-bit header_length");

  EncodedFrame frame;
  OrderedTensors named;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    PIPIT_CHECK(message.tensors[i].defined(), where, "tensor ", i, " is undefined");
    Tensor host = host_contiguous(message.tensors[i]);
    frame.tensor_bytes.emplace_back(host.raw_data(), host.nbytes());
    named.emplace_back(std::to_string(i), host);
    frame.keep_alive.push_back(std::move(host));
  }
  const std::string body_prefix = named.empty() ? std::string() : encode_safetensors_header(named);

  FrameHeader header;
  header.kind = message.kind;
  header.flags = checksum_tensor_bytes ? 0 : kFrameTensorBytesUnchecked;
  header.header_length = static_cast<uint32_t>(json_header.size());
  header.body_length = body_prefix.size();
  for (const auto& [data, bytes] : frame.tensor_bytes) header.body_length += bytes;
  frame.prefix.reserve(kFrameHeaderSize + json_header.size() + body_prefix.size());
  encode_frame_header(frame.prefix, header);
  frame.prefix += json_header;
  frame.prefix += body_prefix;
  Crc32c crc = fixed_header_crc(frame.prefix);
  crc.update(std::string_view(frame.prefix).substr(kFrameHeaderSize));
  if (checksum_tensor_bytes) {
    for (const auto& [data, bytes] : frame.tensor_bytes) crc.update(data, bytes);
  }
  std::string checksum;
  put_le(checksum, crc.value(), 4);
  frame.prefix.replace(12, 4, checksum);
  return frame;
}

std::string EncodedFrame::joined(std::string_view lead) const {
  std::string out;
  out.reserve(lead.size() + size());
  out += lead;
  out += prefix;
  for (const auto& [data, bytes] : tensor_bytes) out.append(static_cast<const char*>(data), bytes);
  return out;
}

std::string encode_frame(const Message& message) {
  return encode_frame_parts(message).joined();
}

FrameHeader decode_frame_header(const uint8_t* bytes, const FrameLimits& limits) {
  FrameHeader header;
  header.magic = static_cast<uint32_t>(get_le(bytes, 4));
  require(header.magic == kFrameMagic, "frame: bad magic ", hex(header.magic), " (expected ",
          hex(kFrameMagic), ", \"PIPT\"): not a pipit peer or out of step with the stream");
  header.version = static_cast<uint16_t>(get_le(bytes + 4, 2));
  require(header.version == kProtocolVersion, "frame: unsupported protocol version ",
          header.version, " (this build speaks version ", kProtocolVersion, ")");
  const uint8_t kind = bytes[6];
  // Only kinds some layer of this process registered (comm/message.h).
  require(find_message_kind(static_cast<MessageKind>(kind)) != nullptr,
          "frame: unknown message kind ", static_cast<int>(kind));
  header.kind = static_cast<MessageKind>(kind);
  header.flags = bytes[7];
  require((header.flags & ~kFrameTensorBytesUnchecked) == 0, "frame: unknown flags ",
          hex(header.flags), " (version ", kProtocolVersion, " defines only bit 0)");
  require(!(header.flags & kFrameTensorBytesUnchecked) || limits.accept_unchecked_tensor_bytes,
          "frame: flags ", hex(header.flags),
          " leave the tensors' bytes out of the checksum, which this connection does not "
          "accept");
  header.header_length = static_cast<uint32_t>(get_le(bytes + 8, 4));
  header.checksum = static_cast<uint32_t>(get_le(bytes + 12, 4));
  header.body_length = get_le(bytes + 16, 8);
  require(header.header_length <= limits.max_header_bytes, "frame: header_length ",
          header.header_length, " exceeds the limit of ", limits.max_header_bytes, " bytes");
  require(header.body_length <= limits.max_body_bytes, "frame: body_length ", header.body_length,
          " exceeds the limit of ", limits.max_body_bytes, " bytes");
  return header;
}

size_t frame_body_prefix_length(const FrameHeader& header, const uint8_t* first8) {
  const std::string where = describe(header);
  require(header.body_length >= 8, where, "body of ", header.body_length,
          " bytes is too short for its tensor header length");
  try {
    return 8 + safetensors_header_length(reinterpret_cast<const char*>(first8), header.body_length,
                                         where + "body");
  } catch (const FrameError&) {
    throw;
  } catch (const Error& e) {
    throw FrameError(e.what());
  }
}

std::vector<Tensor> plan_frame_body(const FrameHeader& header, std::string_view body_prefix) {
  const std::string where = describe(header);
  require(body_prefix.size() >= 8 && body_prefix.size() <= header.body_length, where,
          "body prefix of ", body_prefix.size(), " bytes does not fit the ", header.body_length,
          "-byte body");
  try {
    return order_body(plan_safetensors(body_prefix.substr(8),
                                       header.body_length - body_prefix.size(), where + "body"),
                      where);
  } catch (const FrameError&) {
    throw;
  } catch (const Error& e) {
    throw FrameError(e.what());
  }
}

Message decode_frame_message(const FrameHeader& header, std::string_view json_header,
                             std::vector<Tensor> tensors) {
  const std::string where = describe(header);
  require(json_header.size() == header.header_length, where, "JSON header has ", json_header.size(),
          " bytes but header_length says ", header.header_length);
  for (size_t i = 0; i < tensors.size(); ++i) {
    try {
      check_safetensors_values(tensors[i], where + "body tensor '" + std::to_string(i) + "': ");
    } catch (const Error& e) {
      throw FrameError(e.what());
    }
  }
  int64_t plain_step = 0;
  int plain_microbatch = 0, plain_chunk = 0;
  if (read_plain_json_header(json_header, &plain_step, &plain_microbatch, &plain_chunk)) {
    return Message(header.kind, plain_step, plain_microbatch, plain_chunk, std::move(tensors));
  }
  // Control messages are flat: refuse deep nesting before parsing, where it costs memory and
  // recursion.
  try {
    check_json_nesting(json_header, where + "JSON header ", kMaxJsonDepth);
  } catch (const Error& e) {
    throw FrameError(e.what());
  }
  json fields;
  try {
    fields = json::parse(json_header.begin(), json_header.end());
  } catch (const json::exception& e) {
    throw FrameError(where + "JSON header is not valid JSON: " + e.what());
  }
  require(fields.is_object(), where, "JSON header is ", fields.type_name(), ", not an object");
  for (const auto& [key, value] : fields.items()) {
    require(key == "step" || key == "microbatch" || key == "chunk" || key == "meta", where,
            "JSON header has the unknown field \"", key, "\"");
  }
  // Fields first, in order, so a frame with several faults always reports the same one.
  const int64_t step = integer_field<int64_t>(fields, "step", where);
  const int microbatch = integer_field<int>(fields, "microbatch", where);
  const int chunk = integer_field<int>(fields, "chunk", where);
  require(fields.contains("meta"), where, "JSON header lacks \"meta\"");
  Message message(header.kind, step, microbatch, chunk, std::move(tensors));
  message.meta = std::move(fields["meta"]);
  return message;
}

Message decode_frame_payload(const FrameHeader& header, std::string_view json_header,
                             std::string_view body) {
  const std::string where = describe(header);
  require(json_header.size() == header.header_length, where, "JSON header has ", json_header.size(),
          " bytes but header_length says ", header.header_length);
  require(body.size() == header.body_length, where, "body has ", body.size(),
          " bytes but body_length says ", header.body_length);
  require_checksum(header, frame_checksum(header, json_header, body));
  std::vector<Tensor> tensors;
  if (!body.empty()) {
    const size_t prefix =
        frame_body_prefix_length(header, reinterpret_cast<const uint8_t*>(body.data()));
    tensors = plan_frame_body(header, body.substr(0, prefix));
    const char* data = body.data() + prefix;
    for (Tensor& t : tensors) {
      std::memcpy(t.raw_data(), data, t.nbytes());
      data += t.nbytes();
    }
  }
  return decode_frame_message(header, json_header, std::move(tensors));
}

}  // namespace pipit
