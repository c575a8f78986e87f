#include "codec/json_depth.h"

#include "tensor/error.h"

namespace pipit {

void check_json_nesting(std::string_view text, const std::string& where, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      PIPIT_CHECK(++depth <= max_depth, where, "nests deeper than ", max_depth, " levels");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace pipit
