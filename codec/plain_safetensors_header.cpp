#include "codec/plain_safetensors_header.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "codec/plain_json.h"

namespace pipit {
namespace {

bool plain_name(std::string_view name) {
  return !name.empty() && name != "__metadata__" &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-' || c == '/' || c == ':';
         });
}

using plain_json::put_integer, plain_json::take_literal;

bool take_unsigned(std::string_view& text, uint64_t* value) {
  return plain_json::take_integer<uint64_t>(text, 0, UINT64_MAX, value);
}

// A JSON string of plain characters.
bool take_plain_string(std::string_view& text, std::string_view* value) {
  if (!take_literal(text, "\"")) return false;
  const size_t close = text.find('"');
  if (close == std::string_view::npos) return false;
  *value = text.substr(0, close);
  if (!plain_name(*value)) return false;
  text.remove_prefix(close + 1);
  return true;
}

}  // namespace

std::optional<std::string> write_plain_safetensors_header(const OrderedTensors& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  for (const auto& [name, tensor] : tensors) {
    if (!plain_name(name)) return std::nullopt;
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].first < tensors[b].first; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (tensors[order[i - 1]].first == tensors[order[i]].first) return std::nullopt;
  }
  std::vector<uint64_t> offsets(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    offsets[i + 1] = offsets[i] + tensors[i].second.nbytes();
  }
  std::string out = "{";
  for (size_t i : order) {
    const auto& [name, tensor] = tensors[i];
    if (out.size() > 1) out += ',';
    out += '"';
    out += name;
    out += "\":{\"data_offsets\":[";
    put_integer(out, offsets[i]);
    out += ',';
    put_integer(out, offsets[i + 1]);
    out += "],\"dtype\":\"";
    out += dtype_name(tensor.dtype());
    out += "\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape().size(); ++d) {
      if (d > 0) out += ',';
      put_integer(out, static_cast<uint64_t>(tensor.shape()[d]));
    }
    out += "]}";
  }
  out += '}';
  return out;
}

std::optional<std::vector<PlainSafetensorsEntry>> read_plain_safetensors_header(
    std::string_view text) {
  std::vector<PlainSafetensorsEntry> entries;
  if (!take_literal(text, "{")) return std::nullopt;
  while (!text.starts_with('}')) {
    if (!entries.empty() && !take_literal(text, ",")) return std::nullopt;
    PlainSafetensorsEntry e;
    if (!take_plain_string(text, &e.name) || !take_literal(text, ":{\"data_offsets\":[") ||
        !take_unsigned(text, &e.begin) || !take_literal(text, ",") ||
        !take_unsigned(text, &e.end) || !take_literal(text, "],\"dtype\":") ||
        !take_plain_string(text, &e.dtype) || !take_literal(text, ",\"shape\":[")) {
      return std::nullopt;
    }
    while (!take_literal(text, "]")) {
      uint64_t dim = 0;
      if ((!e.shape.empty() && !take_literal(text, ",")) || !take_unsigned(text, &dim)) {
        return std::nullopt;
      }
      e.shape.push_back(dim);
    }
    if (!take_literal(text, "}")) return std::nullopt;
    if (!entries.empty() && !(entries.back().name < e.name)) return std::nullopt;
    entries.push_back(std::move(e));
  }
  text.remove_prefix(1);
  if (text.find_first_not_of(' ') != std::string_view::npos) return std::nullopt;
  return entries;
}

}  // namespace pipit
