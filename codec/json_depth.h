#pragma once
// A bound on the nesting of JSON text, checked before it is parsed. nlohmann parses any depth,
// but copying, comparing and printing a document recurse once per level, so a deeply nested
// one from a file or a peer (a model config in a checkpoint or stage package, a safetensors
// header) overflows the stack. Everything pipit writes nests a few levels.
#include <cstddef>
#include <string>
#include <string_view>

namespace pipit {

constexpr size_t kMaxJsonNesting = 64;

// Throws an Error "<where>nests deeper than <max_depth> levels" when arrays and objects in
// `text` nest deeper; brackets inside strings do not count, and the text need not be valid.
void check_json_nesting(std::string_view text, const std::string& where,
                        size_t max_depth = kMaxJsonNesting);

}  // namespace pipit
