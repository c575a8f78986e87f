#include "tensor/precision.h"

#include <atomic>

#include "tensor/error.h"

namespace pipit {
namespace {

std::atomic<bool> allow_tf32{false};

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  PIPIT_CHECK(precision == "highest" || precision == "high",
              "set_float32_matmul_precision: expected \"highest\" or \"high\", got \"", precision,
              "\"");
  allow_tf32 = precision == "high";
}

std::string float32_matmul_precision() {
  return allow_tf32 ? "high" : "highest";
}

}  // namespace pipit
