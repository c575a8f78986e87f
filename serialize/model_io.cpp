#include "serialize/model_io.h"

#include <filesystem>

#include "nn/registry.h"
#include "serialize/atomic_file.h"
#include "serialize/safetensors.h"

namespace pipit {

void save_model(const Module& model, const std::string& dir) {
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/config.json", model.config().dump(2) + "\n");
  save_safetensors(dir + "/model.safetensors", model.state_dict());
}

std::shared_ptr<Module> load_model(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  json config;
  try {
    config = json::parse(read_file(config_path));
  } catch (const json::exception& e) {
    throw Error("load_model: '" + config_path + "' is not valid JSON: " + e.what());
  }
  std::shared_ptr<Module> model;
  try {
    model = build_module(config);
  } catch (const Error& e) {
    throw Error("load_model: '" + config_path + "': " + e.what());
  }
  const std::string weights_path = dir + "/model.safetensors";
  try {
    model->load_state_dict(load_safetensors(weights_path));
  } catch (const Error& e) {
    throw Error("load_model: '" + weights_path + "': " + e.what());
  }
  return model;
}

}  // namespace pipit
