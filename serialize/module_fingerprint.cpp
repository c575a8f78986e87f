#include "serialize/module_fingerprint.h"

#include "codec/crc32c.h"

namespace pipit {

std::string module_fingerprint(const Module& model) {
  std::string text = model.config().dump();
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor t = p.contiguous();
    text += "|" + name + ":";
    text += std::to_string(
        crc32c(std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes())));
  }
  return text;
}

}  // namespace pipit
