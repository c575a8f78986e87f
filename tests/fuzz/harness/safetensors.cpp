// The safetensors harness: a blob decoded from memory in data order, into a StateDict, in
// the two steps a socket reader takes (header length, then the planned layout), and from a
// file. Every path must agree, and an accepted blob must re-encode to the same tensors and
// metadata.
#include <cstring>
#include <optional>

#include "codec/safetensors.h"
#include "pipit.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {

using nlohmann::json;

bool fuzz_safetensors(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);

  std::optional<OrderedTensors> ordered;
  json metadata = json::object();
  refuses_only_with("decode_safetensors_ordered",
                    [&] { ordered = decode_safetensors_ordered(bytes, size, kSource, &metadata); });

  std::optional<SafetensorsLayout> layout;
  refuses_only_with("safetensors_header_length and plan_safetensors", [&] {
    const uint64_t header = safetensors_header_length(bytes, size, kSource);
    require(header <= size - 8, "safetensors_header_length exceeds the blob");
    SafetensorsLayout planned = plan_safetensors({bytes + 8, header}, size - 8 - header, kSource);
    // As a socket reader does: fill the planned tensors, then check what their bytes hold.
    for (const SafetensorsEntry& e : planned) {
      if (e.end > e.begin) {
        std::memcpy(e.tensor.raw_data(), bytes + 8 + header + e.begin, e.end - e.begin);
      }
      check_safetensors_values(e.tensor, kSource + ": tensor '" + e.name + "': ");
    }
    layout = std::move(planned);
  });
  require(ordered.has_value() == layout.has_value(),
          "decoding in one step and in two steps disagree on whether the blob is valid");

  std::optional<StateDict> dict;
  refuses_only_with("decode_safetensors", [&] { dict = decode_safetensors(bytes, size, kSource); });
  require(ordered.has_value() == dict.has_value(),
          "decode_safetensors and decode_safetensors_ordered disagree");

  std::optional<StateDict> loaded;
  json file_metadata = json::object();
  {
    const ScratchFile file("safetensors", data, size);
    refuses_only_with("load_safetensors",
                      [&] { loaded = load_safetensors(file.path(), &file_metadata); });
  }
  require(ordered.has_value() == loaded.has_value(),
          "load_safetensors and decoding the same bytes in memory disagree");
  if (!ordered) return false;

  require(layout->size() == ordered->size() && dict->size() == ordered->size(),
          "the decoding paths find different numbers of tensors");
  for (size_t i = 0; i < ordered->size(); ++i) {
    const auto& [name, tensor] = (*ordered)[i];
    const SafetensorsEntry& planned = (*layout)[i];
    require(planned.name == name && planned.tensor.shape() == tensor.shape() &&
                planned.tensor.dtype() == tensor.dtype() &&
                planned.end - planned.begin == tensor.nbytes(),
            "plan_safetensors and decode_safetensors_ordered lay out '" + name + "' differently");
    require(dict->count(name) && same_tensor(dict->at(name), tensor),
            "decode_safetensors and decode_safetensors_ordered differ on '" + name + "'");
  }
  require(same_tensors(*dict, *loaded) && file_metadata == metadata,
          "load_safetensors and decoding the same bytes in memory differ");

  StateDict back;
  json back_metadata = json::object();
  must_not_throw("re-encoding a decoded blob and decoding it again", [&] {
    const std::string again = encode_safetensors(*dict, metadata);
    back = decode_safetensors(again.data(), again.size(), "re-encoded", &back_metadata);
  });
  require(same_tensors(back, *dict) && back_metadata == metadata,
          "a decoded blob does not survive re-encoding");
  return true;
}

std::vector<std::string> safetensors_seeds() {
  StateDict mixed;
  mixed["weight"] = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  mixed["bias"] = from_vector<double>({-1.5, 0.25}, {2});
  mixed["ids"] = from_vector<int64_t>({3, 1, 4, 1, 5}, {5});
  mixed["count"] = from_vector<int32_t>({42}, {});
  mixed["half"] = from_vector<float>({0.5f, -2}, {1, 2}).to(DType::f16);
  mixed["brain"] = from_vector<float>({3, 1e-3f}, {2, 1}).to(DType::bf16);
  mixed["empty"] = zeros({0, 3});
  mixed["mask"] = gt(from_vector<float>({1, -1, 2}, {3}), scalar_tensor(0));
  StateDict one;
  one["x"] = ones({4});
  return {encode_safetensors({}), encode_safetensors(one),
          encode_safetensors(mixed, {{"format", "pt"}, {"note", "fuzz seed"}})};
}

}  // namespace pipit::fuzz
