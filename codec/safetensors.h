#pragma once
// The safetensors layout, pipit's one codec for tensors on disk and on the wire:
// 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian bytes, offsets counted from the end of the header.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/atomic_file.h"
#include "tensor/state_dict.h"

namespace pipit {

// Named tensors in the order their bytes lie in a blob (a StateDict would sort the names).
using OrderedTensors = std::vector<std::pair<std::string, Tensor>>;

std::string encode_safetensors(const StateDict& tensors,
                               const nlohmann::json& metadata = nlohmann::json::object());
// The blob up to its data: the length field and the padded JSON header describing `tensors`
// laid out in the given order, each taking nbytes(). Appending each tensor's contiguous bytes
// in that order completes the blob, which lets a socket writer send them from where they lie.
std::string encode_safetensors_header(const OrderedTensors& tensors,
                                      const nlohmann::json& metadata = nlohmann::json::object());
// A tensor's bytes as the layout above takes them: host memory in row-major order (t itself
// when its bytes already lie so, else a copy).
Tensor host_contiguous(const Tensor& t);

// Validates every field; errors name `source` (a file or frame) and the field. The returned
// tensors own their memory.
StateDict decode_safetensors(const char* data, size_t size, const std::string& source,
                             nlohmann::json* metadata = nullptr);
// The same, with the tensors in the order of their data.
OrderedTensors decode_safetensors_ordered(const char* data, size_t size, const std::string& source,
                                          nlohmann::json* metadata = nullptr);

// Decoding in two steps, for readers that place the data themselves (a socket reading
// straight into tensor memory): the header length from the first 8 bytes of a blob of
// `size` bytes, then the validated layout of the data section (`data_size` bytes) with
// every tensor allocated but not filled, in data order.
struct SafetensorsEntry {
  std::string name;
  Tensor tensor;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};
using SafetensorsLayout = std::vector<SafetensorsEntry>;
uint64_t safetensors_header_length(const char* data, size_t size, const std::string& source);
SafetensorsLayout plan_safetensors(std::string_view header_text, uint64_t data_size,
                                   const std::string& source, nlohmann::json* metadata = nullptr);
// Refuses bytes the tensor's dtype does not allow (a BOOL byte other than 0 or 1), naming the
// element; `where` starts the message. The decoders above run it; a reader that fills a
// planned layout itself runs it once the bytes are in.
void check_safetensors_values(const Tensor& tensor, const std::string& where);

// Written to a temporary file, fsynced and renamed: a crash leaves the old file or the new.
// `on_progress` as write_file_atomic's and read_file's (atomic_file.h).
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const nlohmann::json& metadata = nlohmann::json::object(),
                      const ByteProgress& on_progress = {});
StateDict load_safetensors(const std::string& path, nlohmann::json* metadata = nullptr,
                           const ByteProgress& on_progress = {});

}  // namespace pipit
