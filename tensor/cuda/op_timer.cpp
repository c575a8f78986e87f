#include "tensor/cuda/op_timer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"

namespace pipit::cuda {
namespace {

// How deep this thread is inside timed calls: a backend op that calls the backend again
// (through backend(), which returns the timer) must not be counted twice.
thread_local int timed_depth = 0;

struct DepthScope {
  DepthScope() { ++timed_depth; }
  ~DepthScope() { --timed_depth; }
};

}  // namespace

struct OpTimer::State {
  struct Pending {
    std::string name;
    cudaEvent_t start, stop;
    double host_ms;
  };
  std::mutex mutex;
  std::vector<Pending> pending;
  std::map<std::string, OpTime> totals;
  // Events whose times have been read, for reuse: creating one per op would cost more than
  // the small kernels being timed.
  std::vector<cudaEvent_t> spare;

  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!spare.empty()) {
        cudaEvent_t event = spare.back();
        spare.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    PIPIT_CUDA_CHECK("op timer", cudaEventCreate(&event));
    return event;
  }
};

OpTimer::OpTimer(Backend& inner) : inner_(inner), state_(std::make_unique<State>()) {
  PIPIT_CHECK(inner.device().is_cuda(), "OpTimer: wraps a CUDA backend, got ", inner.device());
}

OpTimer::~OpTimer() {
  for (const auto& p : state_->pending) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t event : state_->spare) cudaEventDestroy(event);
  cudaGetLastError();  // a destructor cannot report it; it must not stick to the next op
}

template <typename Call>
void OpTimer::timed(const char* method, const char* op, Call&& call) {
  if (!enabled_ || timed_depth > 0) return call();
  DepthScope depth;
  const int index = inner_.device().index;
  DeviceGuard guard(index);
  auto stream = static_cast<cudaStream_t>(current_stream_handle(index));
  const cudaEvent_t start = state_->take_event(), stop = state_->take_event();
  PIPIT_CUDA_CHECK("op timer", cudaEventRecord(start, stream));
  const auto host_start = std::chrono::steady_clock::now();
  try {
    call();
  } catch (...) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->spare.insert(state_->spare.end(), {start, stop});
    throw;
  }
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
          .count();
  PIPIT_CUDA_CHECK("op timer", cudaEventRecord(stop, stream));
  std::string name = op ? std::string(method) + "." + op : std::string(method);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->pending.push_back({std::move(name), start, stop, host_ms});
}

std::vector<OpTime> OpTimer::report() {
  DeviceGuard guard(inner_.device().index);
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& p : state_->pending) {
    PIPIT_CUDA_CHECK("op timer", cudaEventSynchronize(p.stop));
    float ms = 0;
    PIPIT_CUDA_CHECK("op timer", cudaEventElapsedTime(&ms, p.start, p.stop));
    OpTime& total = state_->totals[p.name];
    total.name = p.name;
    total.calls += 1;
    total.gpu_ms += ms;
    total.host_ms += p.host_ms;
    state_->spare.insert(state_->spare.end(), {p.start, p.stop});
  }
  state_->pending.clear();
  std::vector<OpTime> ops;
  for (const auto& [name, total] : state_->totals) ops.push_back(total);
  std::sort(ops.begin(), ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.gpu_ms > b.gpu_ms; });
  return ops;
}

void OpTimer::reset() {
  report();
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->totals.clear();
}

std::shared_ptr<Storage> OpTimer::allocate(size_t nbytes) {
  std::shared_ptr<Storage> storage;
  timed("allocate", nullptr, [&] { storage = inner_.allocate(nbytes); });
  return storage;
}

void OpTimer::copy(const Tensor& src, const Tensor& dst) {
  timed("copy", nullptr, [&] { inner_.copy(src, dst); });
}

void OpTimer::fill(const Tensor& out, double value) {
  timed("fill", nullptr, [&] { inner_.fill(out, value); });
}

void OpTimer::arange(const Tensor& out, double start, double step) {
  timed("arange", nullptr, [&] { inner_.arange(out, start, step); });
}

void OpTimer::uniform(const Tensor& out, Generator& generator, double low, double high) {
  timed("uniform", nullptr, [&] { inner_.uniform(out, generator, low, high); });
}

void OpTimer::normal(const Tensor& out, Generator& generator, double mean, double std) {
  timed("normal", nullptr, [&] { inner_.normal(out, generator, mean, std); });
}

void OpTimer::unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  timed("unary", op_name(op), [&] { inner_.unary(op, in, out); });
}

void OpTimer::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  timed("binary", op_name(op), [&] { inner_.binary(op, a, b, out); });
}

void OpTimer::where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) {
  timed("where", nullptr, [&] { inner_.where(mask, a, b, out); });
}

void OpTimer::reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
                     const Tensor& out) {
  timed("reduce", op_name(op), [&] { inner_.reduce(op, in, dims, out); });
}

void OpTimer::argmax(const Tensor& in, int64_t dim, const Tensor& out) {
  timed("argmax", nullptr, [&] { inner_.argmax(in, dim, out); });
}

void OpTimer::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  timed("matmul", nullptr, [&] { inner_.matmul(a, b, out, accumulate); });
}

void OpTimer::softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  timed(log ? "log_softmax" : "softmax", nullptr, [&] { inner_.softmax(in, dim, log, out); });
}

void OpTimer::causal_softmax(const Tensor& scores, double scale, const Tensor& out) {
  timed("causal_softmax", nullptr, [&] { inner_.causal_softmax(scores, scale, out); });
}

void OpTimer::causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                                      const Tensor& grad_scores) {
  timed("causal_softmax_backward", nullptr,
        [&] { inner_.causal_softmax_backward(grad, out, scale, grad_scores); });
}

void OpTimer::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        bool causal, const Tensor& out, const Tensor& lse) {
  timed("attention", nullptr, [&] { inner_.attention(q, k, v, scale, causal, out, lse); });
}

void OpTimer::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse,
                                 double scale, bool causal, const Tensor& grad_q,
                                 const Tensor& grad_k, const Tensor& grad_v) {
  timed("attention_backward", nullptr, [&] {
    inner_.attention_backward(grad_out, q, k, v, out, lse, scale, causal, grad_q, grad_k, grad_v);
  });
}

void OpTimer::softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                               const Tensor& grad_in) {
  timed(log ? "log_softmax_backward" : "softmax_backward", nullptr,
        [&] { inner_.softmax_backward(grad, out, dim, log, grad_in); });
}

void OpTimer::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  timed("layer_norm", nullptr, [&] { inner_.layer_norm(x, weight, bias, eps, out, mean, rstd); });
}

void OpTimer::layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                                  const Tensor& grad_weight, const Tensor& grad_bias) {
  timed("layer_norm_backward", nullptr, [&] {
    inner_.layer_norm_backward(grad, x, weight, mean, rstd, grad_x, grad_weight, grad_bias);
  });
}

void OpTimer::embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  timed("embedding", nullptr, [&] { inner_.embedding(weight, indices, out); });
}

void OpTimer::embedding_backward(const Tensor& grad, const Tensor& indices,
                                 const Tensor& grad_weight) {
  timed("embedding_backward", nullptr,
        [&] { inner_.embedding_backward(grad, indices, grad_weight); });
}

void OpTimer::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& losses) {
  timed("cross_entropy", nullptr,
        [&] { inner_.cross_entropy(logits, targets, ignore_index, losses); });
}

void OpTimer::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, const Tensor& scale,
                                     const Tensor& grad_logits) {
  timed("cross_entropy_backward", nullptr,
        [&] { inner_.cross_entropy_backward(logits, targets, ignore_index, scale, grad_logits); });
}

void OpTimer::conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
                     const Tensor& out) {
  timed("conv2d", nullptr, [&] { inner_.conv2d(x, weight, geometry, out); });
}

void OpTimer::conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                                    const Conv2dGeometry& geometry, const Tensor& grad_x) {
  timed("conv2d_backward_input", nullptr,
        [&] { inner_.conv2d_backward_input(grad_out, weight, geometry, grad_x); });
}

void OpTimer::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                     const Conv2dGeometry& geometry, const Tensor& grad_weight) {
  timed("conv2d_backward_weight", nullptr,
        [&] { inner_.conv2d_backward_weight(grad_out, x, geometry, grad_weight); });
}

void OpTimer::max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                         const Tensor& argmax) {
  timed("max_pool2d", nullptr, [&] { inner_.max_pool2d(x, window, out, argmax); });
}

void OpTimer::max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                                  const Pool2dGeometry& window, const Tensor& grad_x) {
  timed("max_pool2d_backward", nullptr,
        [&] { inner_.max_pool2d_backward(grad_out, argmax, window, grad_x); });
}

void OpTimer::avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) {
  timed("avg_pool2d", nullptr, [&] { inner_.avg_pool2d(x, window, out); });
}

void OpTimer::avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                                  const Tensor& grad_x) {
  timed("avg_pool2d_backward", nullptr,
        [&] { inner_.avg_pool2d_backward(grad_out, window, grad_x); });
}

void OpTimer::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                       double lr, double momentum, double weight_decay, bool first_step) {
  timed("sgd_step", nullptr, [&] {
    inner_.sgd_step(param, grad, momentum_buffer, lr, momentum, weight_decay, first_step);
  });
}

void OpTimer::dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
                      const Tensor& mask) {
  timed("dropout", nullptr, [&] { inner_.dropout(in, generator, p, out, mask); });
}

void OpTimer::adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& params) {
  timed("adamw_step", nullptr, [&] { inner_.adamw_step(slots, params); });
}

}  // namespace pipit::cuda
