#pragma once
// What the ranks of an SPMD job compare at start-up: every rank must have built the same
// model from the same config and seed, and this text differs when they did not.
#include <string>

#include "nn/module.h"

namespace pipit {

// The module's config and, per parameter, its name and a checksum of its bytes.
std::string module_fingerprint(const Module& model);

}  // namespace pipit
