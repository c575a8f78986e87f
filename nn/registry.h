#pragma once
// Builds modules from their config() JSON: the JSON that sits beside saved weights and that
// travels to pipeline workers. Built-in types are always known; register your own with
// register_module_type.
#include <functional>
#include <memory>
#include <string>

#include "nn/module.h"

namespace pipit {

using ModuleFactory = std::function<std::shared_ptr<Module>(const json& config)>;

// Unknown types and missing or mistyped fields are errors naming the type and the field.
std::shared_ptr<Module> build_module(const json& config);
void register_module_type(const std::string& type, ModuleFactory factory);

// Reads an integer field for a factory, with an error naming the type and field.
int64_t config_int(const json& config, const char* field);
double config_number(const json& config, const char* field);

}  // namespace pipit
