// Attention through cuDNN's fused SDPA (flash attention), built with the cuDNN frontend's
// graph API as llm.c does: a graph per shape, layout and dtype, built once (building is slow)
// and cached; the backward asks for cuDNN's deterministic algorithm, so training repeats bit
// for bit. Without the frontend (tools/install_deps.sh installs its headers) the entry points
// below refuse and CudaBackend::attention keeps to pipit's kernels.
#include "tensor/cuda/attention.cuh"
#include "tensor/cuda/attention_provider.h"

#ifdef PIPIT_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cudnn_handle.h"
#endif

namespace pipit::cuda {

bool cudnn_attention_built() {
#ifdef PIPIT_WITH_CUDNN_FRONTEND
  return true;
#else
  return false;
#endif
}

#ifdef PIPIT_WITH_CUDNN_FRONTEND
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kGradOut, kGradQ, kGradK, kGradV };

std::vector<int64_t> dims_of(const Tensor& t) {
  return {t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]};
}
std::vector<int64_t> strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
}

// What a cached graph was built for: device, pass, dtype, and every operand's dims and strides.
using GraphKey = std::tuple<int, bool, DType, std::vector<std::vector<int64_t>>>;

struct Graphs {
  std::mutex mutex;
  std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> built;
};

Graphs& graphs() {
  static Graphs* g = new Graphs;  // never destroyed: cuDNN may be gone at static teardown
  return *g;
}

void check(const char* op, fe::error_object status, const char* what) {
  PIPIT_CHECK(status.is_good(), op, ": cuDNN's fused attention, ", what, ": ",
              status.get_message());
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& graph, Uid uid,
                                                    const char* name, const Tensor& t) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims_of(t))
                          .set_stride(strides_of(t)));
}

void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& out, Uid uid,
                const Tensor& t) {
  out->set_output(true).set_uid(uid).set_dim(dims_of(t)).set_stride(strides_of(t));
}

std::shared_ptr<fe::graph::Tensor_attributes> scale_input(fe::graph::Graph& graph) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("scale")
                          .set_uid(kScale)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(true)
                          .set_data_type(fe::DataType_t::FLOAT));
}

// lse [B, H, Tq] as cuDNN's stats [B, H, Tq, 1], f32.
fe::graph::Tensor_attributes stats_attributes(const Tensor& lse) {
  const int64_t B = lse.shape()[0], H = lse.shape()[1], T = lse.shape()[2];
  return fe::graph::Tensor_attributes()
      .set_name("stats")
      .set_uid(kStats)
      .set_dim({B, H, T, 1})
      .set_stride({H * T, T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

// The cached graph for `key`, or the one `make` builds (then validated, planned and cached).
template <typename Make>
std::shared_ptr<fe::graph::Graph> cached(const char* op, const GraphKey& key, cudnnHandle_t handle,
                                         Make&& make) {
  Graphs& cache = graphs();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.built.find(key);
  if (it != cache.built.end()) return it->second;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph
      ->set_io_data_type(std::get<2>(key) == DType::bf16 ? fe::DataType_t::BFLOAT16
                                                         : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  make(*graph);
  check(op, graph->validate(), "validate");
  check(op, graph->build_operation_graph(handle), "build_operation_graph");
  check(op, graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check(op, graph->check_support(handle), "check_support");
  check(op, graph->build_plans(handle), "build_plans");
  cache.built.emplace(key, graph);
  return graph;
}

void execute(const char* op, fe::graph::Graph& graph, cudnnHandle_t handle,
             std::unordered_map<int64_t, void*>& pointers, Device device) {
  int64_t workspace_bytes = 0;
  check(op, graph.get_workspace_size(workspace_bytes), "get_workspace_size");
  const Tensor workspace =
      Tensor::empty({std::max<int64_t>(workspace_bytes, 1)}, DType::b8, device);
  check(op, graph.execute(handle, pointers, workspace.raw_data()), "execute");
}

}  // namespace

bool attention_cudnn_supports(const Tensor& q, const Tensor& k, const AttentionGeometry& g) {
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  // Its backward refuses one query and one key (seen on an H200, cuDNN 9).
  if (k.dtype() != q.dtype() || g.queries != g.keys || g.queries < 2) return false;
  if (g.head_dim % 8 != 0 || g.head_dim > 128) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 8;
}

void attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionGeometry& g, const Tensor& out, const Tensor& lse) {
  const char* op = "attention";
  const int device = q.device().index;
  DnnHandle& dnn = dnn_handle(op, device);
  std::lock_guard<std::mutex> lock(dnn.mutex);
  use_current_stream(op, dnn, device);
  const GraphKey key{
      device,
      g.causal,
      q.dtype(),
      {dims_of(q), strides_of(q), strides_of(k), strides_of(v), strides_of(out), {0}}};
  auto graph = cached(op, key, dnn.handle, [&](fe::graph::Graph& graph) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)
                       .set_causal_mask(g.causal)
                       .set_attn_scale(scale_input(graph));
    auto [o, stats] = graph.sdpa(input(graph, kQ, "q", q), input(graph, kK, "k", k),
                                 input(graph, kV, "v", v), options);
    set_output(o, kO, out);
    const auto attributes = stats_attributes(lse);
    stats->set_output(true)
        .set_uid(kStats)
        .set_dim(attributes.get_dim())
        .set_stride(attributes.get_stride())
        .set_data_type(fe::DataType_t::FLOAT);
  });
  float scale = static_cast<float>(g.scale);
  std::unordered_map<int64_t, void*> pointers = {{kQ, q.raw_data()},       {kK, k.raw_data()},
                                                 {kV, v.raw_data()},       {kO, out.raw_data()},
                                                 {kStats, lse.raw_data()}, {kScale, &scale}};
  execute(op, *graph, dnn.handle, pointers, q.device());
}

void attention_backward_cudnn(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse,
                              const AttentionGeometry& g, const Tensor& grad_q,
                              const Tensor& grad_k, const Tensor& grad_v) {
  const char* op = "attention_backward";
  const int device = q.device().index;
  DnnHandle& dnn = dnn_handle(op, device);
  std::lock_guard<std::mutex> lock(dnn.mutex);
  use_current_stream(op, dnn, device);
  const GraphKey key{device,
                     g.causal,
                     q.dtype(),
                     {dims_of(q),
                      strides_of(q),
                      strides_of(k),
                      strides_of(v),
                      strides_of(out),
                      strides_of(grad_out),
                      strides_of(grad_q),
                      strides_of(grad_k),
                      strides_of(grad_v),
                      {1}}};
  auto graph = cached(op, key, dnn.handle, [&](fe::graph::Graph& graph) {
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_deterministic_algorithm(true)
                       .set_causal_mask(g.causal)
                       .set_attn_scale(scale_input(graph));
    auto [dq, dk, dv] = graph.sdpa_backward(input(graph, kQ, "q", q), input(graph, kK, "k", k),
                                            input(graph, kV, "v", v), input(graph, kO, "o", out),
                                            input(graph, kGradOut, "grad_o", grad_out),
                                            graph.tensor(stats_attributes(lse)), options);
    set_output(dq, kGradQ, grad_q);
    set_output(dk, kGradK, grad_k);
    set_output(dv, kGradV, grad_v);
  });
  float scale = static_cast<float>(g.scale);
  std::unordered_map<int64_t, void*> pointers = {{kQ, q.raw_data()},
                                                 {kK, k.raw_data()},
                                                 {kV, v.raw_data()},
                                                 {kO, out.raw_data()},
                                                 {kGradOut, grad_out.raw_data()},
                                                 {kStats, lse.raw_data()},
                                                 {kGradQ, grad_q.raw_data()},
                                                 {kGradK, grad_k.raw_data()},
                                                 {kGradV, grad_v.raw_data()},
                                                 {kScale, &scale}};
  execute(op, *graph, dnn.handle, pointers, q.device());
}

#else

bool attention_cudnn_supports(const Tensor&, const Tensor&, const AttentionGeometry&) {
  return false;
}

void attention_forward_cudnn(const Tensor&, const Tensor&, const Tensor&, const AttentionGeometry&,
                             const Tensor&, const Tensor&) {
  throw Error("attention: this build of pipit has no cuDNN frontend (tools/install_deps.sh)");
}

void attention_backward_cudnn(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const AttentionGeometry&, const Tensor&,
                              const Tensor&, const Tensor&) {
  throw Error(
      "attention_backward: this build of pipit has no cuDNN frontend (tools/install_deps.sh)");
}

#endif

}  // namespace pipit::cuda
