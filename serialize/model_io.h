#pragma once
// A model on disk is a directory: config.json (what build_module rebuilds it from) and
// model.safetensors (its state_dict).
#include <memory>
#include <string>

#include "nn/module.h"

namespace pipit {

void save_model(const Module& model, const std::string& dir);
// Rebuilds the module from config.json and loads the weights strictly; errors name the file.
std::shared_ptr<Module> load_model(const std::string& dir);

}  // namespace pipit
