#include "autograd/autocast.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace pipit {
namespace {

thread_local DType current = DType::f32;

struct CachedCast {
  Tensor source;  // held, so its memory cannot be reused by another tensor meanwhile
  Tensor rounded;
};

// A model has tens to hundreds of parameters: a list is as fast as a map here.
struct CastCacheState {
  int depth = 0;
  std::vector<CachedCast> entries;
};

thread_local CastCacheState cast_cache;

bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

Tensor round_to(const Tensor& t, DType dtype) {
  NoGradGuard no_grad;
  return t.to(dtype);
}

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

CastCache::CastCache() {
  ++cast_cache.depth;
}

CastCache::~CastCache() {
  if (--cast_cache.depth == 0) cast_cache.entries.clear();
}

Tensor autocast_widened(const Tensor& x) {
  return current != DType::f32 && is_half(x.dtype()) ? x.to(DType::f32) : x;
}

Tensor autocast_operand(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  if (cast_cache.depth == 0 || !t.is_leaf() || !t.requires_grad()) return round_to(t, dtype);
  for (const CachedCast& entry : cast_cache.entries) {
    if (entry.rounded.dtype() == dtype && same_view(entry.source, t)) return entry.rounded;
  }
  cast_cache.entries.push_back({t, round_to(t, dtype)});
  return cast_cache.entries.back().rounded;
}

}  // namespace pipit
