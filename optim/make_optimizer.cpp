#include <set>

#include "optim/optimizer.h"

namespace pipit {
namespace {

double number_field(const nlohmann::json& config, const std::string& type, const char* field,
                    double default_value) {
  if (!config.contains(field)) return default_value;
  PIPIT_CHECK(config[field].is_number(), "make_optimizer: ", type, " field \"", field,
              "\" must be a number, got ", config[field].dump());
  return config[field].get<double>();
}

void check_fields(const nlohmann::json& config, const std::string& type,
                  const std::set<std::string>& known) {
  for (const auto& [key, value] : config.items()) {
    PIPIT_CHECK(key == "type" || known.count(key), "make_optimizer: unknown ", type, " field \"",
                key, "\"");
  }
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const nlohmann::json& config,
                                          NamedParameters parameters) {
  PIPIT_CHECK(config.is_object() && config.contains("type") && config["type"].is_string(),
              "make_optimizer: config needs a string \"type\", got ", config.dump());
  const std::string type = config["type"];
  if (type == "SGD") {
    check_fields(config, type, {"lr", "momentum", "weight_decay"});
    SGDOptions o;
    o.lr = number_field(config, type, "lr", o.lr);
    o.momentum = number_field(config, type, "momentum", o.momentum);
    o.weight_decay = number_field(config, type, "weight_decay", o.weight_decay);
    return std::make_unique<SGD>(std::move(parameters), o);
  }
  if (type == "AdamW") {
    check_fields(config, type, {"lr", "beta1", "beta2", "eps", "weight_decay", "no_decay"});
    AdamWOptions o;
    o.lr = number_field(config, type, "lr", o.lr);
    o.beta1 = number_field(config, type, "beta1", o.beta1);
    o.beta2 = number_field(config, type, "beta2", o.beta2);
    o.eps = number_field(config, type, "eps", o.eps);
    o.weight_decay = number_field(config, type, "weight_decay", o.weight_decay);
    for (const nlohmann::json& name : config.value("no_decay", nlohmann::json::array())) {
      PIPIT_CHECK(name.is_string(), "make_optimizer: AdamW no_decay: not a name: ", name.dump());
      o.no_decay.push_back(name);
    }
    return std::make_unique<AdamW>(std::move(parameters), o);
  }
  throw Error("make_optimizer: unknown optimizer type '" + type + "' (expected SGD or AdamW)");
}

}  // namespace pipit
