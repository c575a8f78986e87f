// The module registry harness: JSON text parsed and given to build_module, as load_model,
// checkpoints and stage packages do with the configs they carry. A module that builds must
// write a config() that builds the same module again (same config, same parameter shapes).
#include <algorithm>
#include <cmath>

#include "nn/builders.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/registry.h"
#include "pipit.h"
#include "tests/fuzz/harness/check.h"

namespace pipit::fuzz {
namespace {

using nlohmann::json;

bool same_parameter_shapes(const Module& a, const Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].first != pb[i].first || pa[i].second.shape() != pb[i].second.shape() ||
        pa[i].second.dtype() != pb[i].second.dtype()) {
      return false;
    }
  }
  return true;
}

// A bound on the weights a config declares: per object (one module), the product of the
// integers in it and its arrays, or 16 times its largest integer squared (a TransformerBlock of
// width w holds 12 w^2 weights in its square and 4x-wide matrices), whichever is larger;
// summed over the objects.
double declared_weights(const json& value) {
  if (value.is_array()) {
    double total = 0;
    for (const json& item : value) total += declared_weights(item);
    return total;
  }
  if (!value.is_object()) return 0;
  double product = 1, largest = 0, nested = 0;
  const auto count = [&](const json& field, const auto& self) -> void {
    if (field.is_number_integer() || field.is_number_unsigned()) {
      const double v = std::abs(field.get<double>());
      if (v > 0) product *= v;
      largest = std::max(largest, v);
    } else if (field.is_array()) {
      for (const json& item : field) self(item, self);
    } else if (field.is_object()) {
      nested += declared_weights(field);
    }
  };
  for (const auto& [key, field] : value.items()) count(field, count);
  return std::max(product, 16 * largest * largest) + nested;
}

}  // namespace

bool fuzz_module_config(const uint8_t* data, size_t size) {
  // Not JSON at all is the parser's business, which every caller reports as an Error.
  const json config = json::parse(data, data + size, nullptr, false);
  if (config.is_discarded()) return false;
  // Valid configs of hundreds of MB of weights build by design, taking tens of seconds under
  // the sanitizers (a width of 4611 ran past libFuzzer's 30 s timeout) and reaching no code a
  // small one does not: they are left out. (A TransformerBlock of width 4096 once passed a
  // bound that counted its width squared once, and ran past 40 s in CI.)
  if (declared_weights(config) > double(1 << 24)) return false;
  std::shared_ptr<Module> module;
  if (!refuses_only_with("build_module", [&] { module = build_module(config); })) return false;
  require(module != nullptr, "build_module returned no module");

  json written;
  std::shared_ptr<Module> again;
  must_not_throw("building a built module's config() again", [&] {
    written = module->config();
    again = build_module(written);
  });
  require(again->config() == written, "a module's config() builds a module with another config: " +
                                          written.dump() + " became " + again->config().dump());
  require(same_parameter_shapes(*module, *again),
          "a module's config() builds a module with other parameters");
  return true;
}

std::vector<std::string> module_config_seeds() {
  Generator init(5);
  std::vector<std::string> seeds;
  seeds.push_back(mlp({3, 4, 2}, "gelu", &init)->config().dump());
  seeds.push_back(gpt({5, 4, 1, 2, 4, 0.1}, &init)->config().dump());
  seeds.push_back(
      Sequential(
          {std::make_shared<Conv2d>(1, 2, Size2{3, 3}, Size2{1, 1}, Size2{1, 1}, true, &init),
           std::make_shared<ReLU>(),
           std::make_shared<MaxPool2d>(Size2{2, 2}, Size2{2, 2}, Size2{0, 0}),
           std::make_shared<AvgPool2d>(Size2{2, 2}, Size2{1, 1}, Size2{1, 1}),
           std::make_shared<Flatten>(1, -1), std::make_shared<Tanh>(),
           std::make_shared<Dropout>(0.5, &init), std::make_shared<Embedding>(3, 2, &init)},
          3)
          .config()
          .dump());
  return seeds;
}

}  // namespace pipit::fuzz
