#include "codec/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "codec/atomic_file.h"
#include "codec/json_depth.h"
#include "codec/plain_safetensors_header.h"
#include "tensor/backend.h"

namespace pipit {

static_assert(std::endian::native == std::endian::little,
              "pipit writes tensors in host byte order, which must be little-endian");

namespace {

using json = nlohmann::json;

// Headers beyond this are refused before any allocation: real ones are kilobytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string fail_prefix(const std::string& source) {
  return "safetensors '" + source + "': ";
}

std::string shape_text(const std::vector<uint64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

// One tensor's fields, from either reader of the header: checked against each other and the
// data section, then allocated.
void add_entry(SafetensorsLayout& layout, const std::string& where, const std::string& name,
               const std::string& dtype_text, const std::vector<uint64_t>& dims, uint64_t begin,
               uint64_t end, uint64_t data_size) {
  const std::string field = where + "tensor '" + name + "': ";
  DType dtype;
  try {
    dtype = dtype_from_name(dtype_text);
  } catch (const Error& e) {
    throw Error(field + "\"dtype\": " + e.what());
  }
  Shape shape;
  for (uint64_t d : dims) {
    PIPIT_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), field,
                "\"shape\" ", shape_text(dims), " is too large: dimension ", d, " exceeds int64");
    shape.push_back(static_cast<int64_t>(d));
  }
  // Checked here, before the byte count, which is 0 for any shape with a zero in it: the
  // tensor's strides are still computed from the other dims.
  try {
    check_shape(shape, "\"shape\"");
  } catch (const Error& e) {
    throw Error(field + e.what());
  }
  const uint64_t count = static_cast<uint64_t>(shape_numel(shape));
  PIPIT_CHECK(begin <= end && end <= data_size, field, "\"data_offsets\" [", begin, ", ", end,
              "] lie outside the ", data_size, " data bytes");
  uint64_t nbytes = 0;
  PIPIT_CHECK(!__builtin_mul_overflow(count, dtype_size(dtype), &nbytes) && nbytes == end - begin,
              field, "\"shape\" ", shape_text(dims), " of ", dtype_text, " does not match the ",
              end - begin, " bytes \"data_offsets\" span");
  layout.push_back({name, Tensor::empty(shape, dtype), begin, end});
}

// The JSON library's reader, for headers not in the plain form.
void plan_from_json(SafetensorsLayout& layout, std::string_view header_text, uint64_t data_size,
                    const std::string& where, json* metadata) {
  check_json_nesting(header_text, where + "header ");
  json header;
  try {
    header = json::parse(header_text.begin(), header_text.end());
  } catch (const json::exception& e) {
    throw Error(where + "header is not valid JSON: " + e.what());
  }
  PIPIT_CHECK(header.is_object(), where, "header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      PIPIT_CHECK(entry.is_object(), where, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        PIPIT_CHECK(value.is_string(), where, "__metadata__ value '", key, "' is not a string");
      }
      if (metadata) *metadata = entry;
      continue;
    }
    const std::string field = where + "tensor '" + name + "': ";
    PIPIT_CHECK(entry.is_object(), field, "entry is not an object");
    PIPIT_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), field,
                "missing or non-string \"dtype\"");
    PIPIT_CHECK(entry.contains("shape") && entry["shape"].is_array(), field,
                "missing or non-array \"shape\"");
    PIPIT_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                    entry["data_offsets"].size() == 2,
                field, "missing \"data_offsets\" [begin, end]");
    std::vector<uint64_t> dims;
    for (const json& dim : entry["shape"]) {
      PIPIT_CHECK(dim.is_number_unsigned(), field,
                  "\"shape\" has an entry that is not a non-negative integer: ", dim.dump());
      dims.push_back(dim.get<uint64_t>());
    }
    for (const json& offset : entry["data_offsets"]) {
      PIPIT_CHECK(offset.is_number_unsigned(), field,
                  "\"data_offsets\" entries must be "
                  "non-negative integers, got ",
                  entry["data_offsets"].dump());
    }
    add_entry(layout, where, name, entry["dtype"].get<std::string>(), dims,
              entry["data_offsets"][0], entry["data_offsets"][1], data_size);
  }
}

// The JSON library's writer, for headers with metadata or names not plain.
std::string library_header(const OrderedTensors& tensors, const json& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [key, value] : metadata.items()) {
      meta[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    PIPIT_CHECK(name != "__metadata__", "encode_safetensors: '__metadata__' is not a tensor name");
    PIPIT_CHECK(!header.contains(name), "encode_safetensors: tensor name '", name,
                "' appears twice");
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  return header.dump();
}

}  // namespace

std::string encode_safetensors_header(const OrderedTensors& tensors, const json& metadata) {
  std::optional<std::string> plain;
  if (metadata.empty()) plain = write_plain_safetensors_header(tensors);
  std::string header_text = plain ? std::move(*plain) : library_header(tensors, metadata);
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::string out(8, '\0');
  const uint64_t header_size = header_text.size();
  std::memcpy(out.data(), &header_size, 8);
  out += header_text;
  return out;
}

Tensor host_contiguous(const Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) return t;
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  backend(Device::cpu()).copy(t.device().is_cpu() ? t : copy_of(t, t.dtype(), Device::cpu()), host);
  return host;
}

std::string encode_safetensors(const StateDict& tensors, const json& metadata) {
  std::string out =
      encode_safetensors_header(OrderedTensors(tensors.begin(), tensors.end()), metadata);
  size_t data_size = 0;
  for (const auto& [name, t] : tensors) data_size += t.nbytes();
  out.reserve(out.size() + data_size);
  for (const auto& [name, t] : tensors) {
    const Tensor host = host_contiguous(t);
    out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  return out;
}

SafetensorsLayout plan_safetensors(std::string_view header_text, uint64_t data_size,
                                   const std::string& source, json* metadata) {
  const std::string where = fail_prefix(source);
  SafetensorsLayout layout;
  if (auto plain = read_plain_safetensors_header(header_text)) {
    for (const PlainSafetensorsEntry& e : *plain) {
      add_entry(layout, where, std::string(e.name), std::string(e.dtype), e.shape, e.begin, e.end,
                data_size);
    }
  } else {
    plan_from_json(layout, header_text, data_size, where, metadata);
  }
  std::sort(layout.begin(), layout.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const SafetensorsEntry& e : layout) {
    PIPIT_CHECK(e.begin >= covered, where, "tensor '", e.name,
                "': \"data_offsets\" overlap the "
                "previous tensor's");
    PIPIT_CHECK(e.begin == covered, where, "tensor '", e.name, "': ", e.begin - covered,
                " unused bytes before its \"data_offsets\" (the layout must be dense)");
    covered = e.end;
  }
  PIPIT_CHECK(covered == data_size, where, data_size - covered,
              " bytes after the last tensor belong to none");
  return layout;
}

uint64_t safetensors_header_length(const char* data, size_t size, const std::string& source) {
  const std::string where = fail_prefix(source);
  PIPIT_CHECK(size >= 8, where, "file of ", size,
              " bytes is too short for the 8-byte header length");
  uint64_t header_size;
  std::memcpy(&header_size, data, 8);
  PIPIT_CHECK(header_size <= kMaxHeaderBytes && header_size <= size - 8, where, "header length ",
              header_size, " exceeds the ", size - 8, " bytes after the length field");
  return header_size;
}

void check_safetensors_values(const Tensor& tensor, const std::string& where) {
  if (tensor.dtype() != DType::b8) return;
  // Read as bytes: a bool holding anything but 0 or 1 is undefined behaviour once read as bool.
  const auto* bytes = static_cast<const uint8_t*>(tensor.raw_data());
  for (size_t i = 0; i < tensor.nbytes(); ++i) {
    PIPIT_CHECK(bytes[i] <= 1, where, "BOOL element ", i, " holds the byte ", int(bytes[i]),
                ", not 0 or 1");
  }
}

OrderedTensors decode_safetensors_ordered(const char* data, size_t size, const std::string& source,
                                          json* metadata) {
  const uint64_t header_size = safetensors_header_length(data, size, source);
  const uint64_t data_size = size - 8 - header_size;
  const char* bytes = data + 8 + header_size;
  OrderedTensors tensors;
  for (SafetensorsEntry& e :
       plan_safetensors({data + 8, header_size}, data_size, source, metadata)) {
    if (e.end > e.begin) std::memcpy(e.tensor.raw_data(), bytes + e.begin, e.end - e.begin);
    check_safetensors_values(e.tensor, fail_prefix(source) + "tensor '" + e.name + "': ");
    tensors.emplace_back(std::move(e.name), std::move(e.tensor));
  }
  return tensors;
}

StateDict decode_safetensors(const char* data, size_t size, const std::string& source,
                             json* metadata) {
  OrderedTensors tensors = decode_safetensors_ordered(data, size, source, metadata);
  return StateDict(std::make_move_iterator(tensors.begin()),
                   std::make_move_iterator(tensors.end()));
}

void save_safetensors(const std::string& path, const StateDict& tensors, const json& metadata,
                      const ByteProgress& on_progress) {
  write_file_atomic(path, encode_safetensors(tensors, metadata), on_progress);
}

StateDict load_safetensors(const std::string& path, json* metadata,
                           const ByteProgress& on_progress) {
  const std::string bytes = read_file(path, on_progress);
  return decode_safetensors(bytes.data(), bytes.size(), path, metadata);
}

}  // namespace pipit
