#include "autograd/autocast.h"

#include "tensor/error.h"

namespace pipit {
namespace {

thread_local DType current = DType::f32;

}  // namespace

AutocastGuard::AutocastGuard(DType dtype) : previous_(current) {
  PIPIT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
              "AutocastGuard: dtype must be F32 (off), BF16 or F16, got ", dtype);
  current = dtype;
}

AutocastGuard::~AutocastGuard() {
  current = previous_;
}

DType autocast_dtype() {
  return current;
}

}  // namespace pipit
