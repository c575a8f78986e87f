#pragma once
// OpTimer: where a CUDA run's time goes, op by op. It is a Backend that forwards every call
// to the backend it wraps and, while enabled, records a CUDA event before and after each call
// on the calling thread's current stream. Events are read back only in report(), so timing
// adds no synchronisation between ops and the run keeps its pace.
//
//   cuda::OpTimer timer(backend(device));
//   Backend* previous = set_backend_override(device, &timer);
//   timer.set_enabled(true);
//   ... run ...
//   set_backend_override(device, previous);
//   for (const cuda::OpTime& op : timer.report()) ...
//
// Only outermost calls are timed: a backend op that calls another (matmul copying an operand)
// counts once, under its own name.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tensor/backend.h"

namespace pipit::cuda {

struct OpTime {
  std::string name;  // the Backend method, with its op where it takes one: "binary.mul"
  int64_t calls = 0;
  // Between the events around each call. When the GPU is behind the host this is the op's
  // kernels; when the host is behind, it is the host's time inside the call as well.
  double gpu_ms = 0;
  double host_ms = 0;  // wall time of the calls on the host: launches, checks, allocation
};

class OpTimer final : public Backend {
 public:
  // `inner` must outlive the timer and belong to a CUDA device.
  explicit OpTimer(Backend& inner);
  ~OpTimer() override;
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  void set_enabled(bool enabled) { enabled_ = enabled; }
  // Waits for the recorded events and returns the totals since the last reset, most gpu_ms
  // first.
  std::vector<OpTime> report();
  void reset();

  Device device() const override { return inner_.device(); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& out, double value) override;
  void arange(const Tensor& out, double start, double step) override;
  void uniform(const Tensor& out, Generator& generator, double low, double high) override;
  void normal(const Tensor& out, Generator& generator, double mean, double std) override;
  void unary(UnaryOp op, const Tensor& in, const Tensor& out) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& mask, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& in, std::span<const int64_t> dims,
              const Tensor& out) override;
  void argmax(const Tensor& in, int64_t dim, const Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) override;
  void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) override;
  void softmax_backward(const Tensor& grad, const Tensor& out, int64_t dim, bool log,
                        const Tensor& grad_in) override;
  void causal_softmax(const Tensor& scores, double scale, const Tensor& out) override;
  void causal_softmax_backward(const Tensor& grad, const Tensor& out, double scale,
                               const Tensor& grad_scores) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, double scale, bool causal,
                          const Tensor& grad_q, const Tensor& grad_k,
                          const Tensor& grad_v) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  const Tensor& out, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) override;
  void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) override;
  void embedding_backward(const Tensor& grad, const Tensor& indices,
                          const Tensor& grad_weight) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     const Tensor& losses) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& scale, const Tensor& grad_logits) override;
  void conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
              const Tensor& out) override;
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                             const Conv2dGeometry& geometry, const Tensor& grad_x) override;
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                              const Conv2dGeometry& geometry, const Tensor& grad_weight) override;
  void max_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out,
                  const Tensor& argmax) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& argmax,
                           const Pool2dGeometry& window, const Tensor& grad_x) override;
  void avg_pool2d(const Tensor& x, const Pool2dGeometry& window, const Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dGeometry& window,
                           const Tensor& grad_x) override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay, bool first_step) override;
  void adamw_step(std::span<const AdamWSlot> slots, const AdamWParams& params) override;
  void dropout(const Tensor& in, Generator& generator, double p, const Tensor& out,
               const Tensor& mask) override;

 private:
  struct State;
  template <typename Call>
  void timed(const char* method, const char* op, Call&& call);

  Backend& inner_;
  std::atomic<bool> enabled_{false};
  std::unique_ptr<State> state_;
};

}  // namespace pipit::cuda
