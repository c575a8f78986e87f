#include <algorithm>

#include "tests/fuzz/harness/harness.h"

namespace pipit::fuzz {

const std::vector<Target>& targets() {
#define PIPIT_FUZZ_TARGET_ROW(name, max_len) {#name, fuzz_##name, max_len, name##_seeds},
  static const std::vector<Target> all = {PIPIT_FUZZ_TARGETS(PIPIT_FUZZ_TARGET_ROW)};
#undef PIPIT_FUZZ_TARGET_ROW
  return all;
}

const Target* find_target(std::string_view name) {
  const auto& all = targets();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const Target& t) { return t.name == name; });
  return it == all.end() ? nullptr : &*it;
}

}  // namespace pipit::fuzz
