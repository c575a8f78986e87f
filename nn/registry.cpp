#include "nn/registry.h"

#include <map>
#include <mutex>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace pipit {
namespace {

std::string type_of(const json& config) {
  return config.is_object() && config.contains("type") && config["type"].is_string()
             ? config["type"].get<std::string>()
             : std::string("<no type>");
}

const json& field(const json& config, const char* name) {
  PIPIT_CHECK(config.is_object() && config.contains(name), "build_module: ", type_of(config),
              " config is missing field \"", name, "\"");
  return config[name];
}

// A [height, width] pair of integers, as Conv2d and the pools write them.
Size2 config_pair(const json& config, const char* name) {
  const json& value = field(config, name);
  PIPIT_CHECK(value.is_array() && value.size() == 2 && value[0].is_number_integer() &&
                  value[1].is_number_integer(),
              "build_module: ", type_of(config), " field \"", name,
              "\" must be [height, width] integers, got ", value.dump());
  return {value[0].get<int64_t>(), value[1].get<int64_t>()};
}

std::shared_ptr<Module> build_sequential(const json& c) {
  const json& layers = field(c, "layers");
  PIPIT_CHECK(layers.is_array(), "build_module: Sequential field \"layers\" must be an array");
  std::vector<std::shared_ptr<Module>> built;
  for (const json& layer : layers) built.push_back(build_module(layer));
  const int64_t first = c.contains("first_index") ? config_int(c, "first_index") : 0;
  PIPIT_CHECK(first >= 0, "build_module: Sequential field \"first_index\" must be >= 0");
  auto sequential = std::make_shared<Sequential>(std::move(built), static_cast<size_t>(first));
  if (!c.contains("ties")) return sequential;
  const json& ties = c["ties"];
  PIPIT_CHECK(ties.is_array(), "build_module: Sequential field \"ties\" must be an array");
  for (const json& tie : ties) {
    PIPIT_CHECK(tie.is_array() && tie.size() == 2 && tie[0].is_string() && tie[1].is_string(),
                "build_module: each Sequential tie must be [parameter, tied_to] names, got ",
                tie.dump());
    sequential->tie(tie[0].get<std::string>(), tie[1].get<std::string>());
  }
  return sequential;
}

// Built-in types are registered here, not by static initialisers, which a static library
// drops when nothing references their object file.
std::map<std::string, ModuleFactory> builtin_factories() {
  std::map<std::string, ModuleFactory> f;
  f["Linear"] = [](const json& c) {
    const json& bias = field(c, "bias");
    PIPIT_CHECK(bias.is_boolean(), "build_module: Linear field \"bias\" must be a boolean");
    return std::make_shared<Linear>(config_int(c, "in"), config_int(c, "out"), bias.get<bool>());
  };
  f["Conv2d"] = [](const json& c) {
    const json& bias = field(c, "bias");
    PIPIT_CHECK(bias.is_boolean(), "build_module: Conv2d field \"bias\" must be a boolean");
    return std::make_shared<Conv2d>(config_int(c, "in"), config_int(c, "out"),
                                    config_pair(c, "kernel"), config_pair(c, "stride"),
                                    config_pair(c, "padding"), bias.get<bool>());
  };
  f["MaxPool2d"] = [](const json& c) {
    return std::make_shared<MaxPool2d>(config_pair(c, "kernel"), config_pair(c, "stride"),
                                       config_pair(c, "padding"));
  };
  f["AvgPool2d"] = [](const json& c) {
    return std::make_shared<AvgPool2d>(config_pair(c, "kernel"), config_pair(c, "stride"),
                                       config_pair(c, "padding"));
  };
  f["Flatten"] = [](const json& c) {
    return std::make_shared<Flatten>(config_int(c, "start_dim"), config_int(c, "end_dim"));
  };
  f["Embedding"] = [](const json& c) {
    return std::make_shared<Embedding>(config_int(c, "num"), config_int(c, "dim"));
  };
  f["TokenPosEmbedding"] = [](const json& c) {
    return std::make_shared<TokenPosEmbedding>(config_int(c, "vocab"), config_int(c, "context"),
                                               config_int(c, "width"), nullptr,
                                               c.contains("rows") ? config_int(c, "rows") : 0);
  };
  f["LayerNorm"] = [](const json& c) {
    return std::make_shared<LayerNorm>(config_int(c, "dim"), config_number(c, "eps"));
  };
  f["Dropout"] = [](const json& c) { return std::make_shared<Dropout>(config_number(c, "p")); };
  f["ReLU"] = [](const json&) { return std::make_shared<ReLU>(); };
  f["GELU"] = [](const json&) { return std::make_shared<GELU>(); };
  f["Tanh"] = [](const json&) { return std::make_shared<Tanh>(); };
  f["CausalSelfAttention"] = [](const json& c) {
    return std::make_shared<CausalSelfAttention>(config_int(c, "width"), config_int(c, "heads"),
                                                 config_number(c, "dropout"));
  };
  f["TransformerBlock"] = [](const json& c) {
    const double eps = c.contains("layer_norm_eps") ? config_number(c, "layer_norm_eps") : 1e-5;
    return std::make_shared<TransformerBlock>(config_int(c, "width"), config_int(c, "heads"),
                                              config_number(c, "dropout"), nullptr, eps);
  };
  f["Sequential"] = build_sequential;
  return f;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, ModuleFactory>& registry() {
  static std::map<std::string, ModuleFactory> factories = builtin_factories();
  return factories;
}

}  // namespace

int64_t config_int(const json& config, const char* name) {
  const json& value = field(config, name);
  PIPIT_CHECK(value.is_number_integer(), "build_module: ", type_of(config), " field \"", name,
              "\" must be an integer, got ", value.dump());
  return value.get<int64_t>();
}

double config_number(const json& config, const char* name) {
  const json& value = field(config, name);
  PIPIT_CHECK(value.is_number(), "build_module: ", type_of(config), " field \"", name,
              "\" must be a number, got ", value.dump());
  return value.get<double>();
}

std::shared_ptr<Module> build_module(const json& config) {
  PIPIT_CHECK(config.is_object(), "build_module: a module config must be a JSON object, got ",
              config.dump());
  const std::string type = type_of(config);
  ModuleFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(type);
    PIPIT_CHECK(it != registry().end(), "build_module: unknown module type '", type, "'");
    factory = it->second;
  }
  return factory(config);
}

void register_module_type(const std::string& type, ModuleFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[type] = std::move(factory);
}

}  // namespace pipit
