// Convolutions on CUDA through cuDNN's descriptor API (deprecated in cuDNN 9 in favour of the
// graph API, still complete): NCHW, f32 or f64, groups = 1.
//
// f32 runs with FMA math only: TF32 tensor cores would change results at the 1e-3 level, as
// for cuBLAS (cuda_backend.cpp). Algorithms come from cuDNN's heuristics, deterministic ones
// first so that a rerun gives the same bits, as on the CPU; among those the fastest whose
// workspace the caching allocator can provide.
#include <cudnn.h>

#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/cudnn_check.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

template <typename Handle, cudnnStatus_t (*destroy)(Handle)>
struct Destroy {
  void operator()(Handle h) const { destroy(h); }
};
using TensorDesc = std::unique_ptr<cudnnTensorStruct,
                                   Destroy<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>>;
using FilterDesc = std::unique_ptr<cudnnFilterStruct,
                                   Destroy<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>>;
using ConvDesc =
    std::unique_ptr<cudnnConvolutionStruct,
                    Destroy<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>>;

int as_int(const char* op, int64_t v) {
  PIPIT_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), op, ": size ", v,
              " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

cudnnDataType_t data_type(const char* op, DType dtype) {
  PIPIT_CHECK(dtype == DType::f32 || dtype == DType::f64, op, ": dtype ", dtype,
              " is not supported (expected F32 or F64)");
  return dtype == DType::f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
}

// x [N, C, H, W], w [O, C, kh, kw] and y [N, O, OH, OW], all contiguous, and the convolution
// between them. cuDNN's own output size is checked against y's, so a geometry that cuDNN reads
// differently fails here rather than writing out of bounds.
struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;

  Descriptors(const char* op, const Tensor& xt, const Tensor& wt, const Tensor& yt,
              const Conv2dGeometry& g) {
    const cudnnDataType_t type = data_type(op, xt.dtype());
    x = tensor(op, xt, type);
    y = tensor(op, yt, type);
    cudnnFilterDescriptor_t raw_w = nullptr;
    PIPIT_CUDNN_CHECK(op, cudnnCreateFilterDescriptor(&raw_w));
    w.reset(raw_w);
    const Shape& ws = wt.shape();
    PIPIT_CUDNN_CHECK(
        op, cudnnSetFilter4dDescriptor(raw_w, type, CUDNN_TENSOR_NCHW, as_int(op, ws[0]),
                                       as_int(op, ws[1]), as_int(op, ws[2]), as_int(op, ws[3])));
    cudnnConvolutionDescriptor_t raw_conv = nullptr;
    PIPIT_CUDNN_CHECK(op, cudnnCreateConvolutionDescriptor(&raw_conv));
    conv.reset(raw_conv);
    PIPIT_CUDNN_CHECK(
        op, cudnnSetConvolution2dDescriptor(raw_conv, as_int(op, g.pad_h), as_int(op, g.pad_w),
                                            as_int(op, g.stride_h), as_int(op, g.stride_w),
                                            as_int(op, g.dilation_h), as_int(op, g.dilation_w),
                                            CUDNN_CROSS_CORRELATION, type));
    int n = 0, c = 0, h = 0, wd = 0;
    PIPIT_CUDNN_CHECK(
        op, cudnnGetConvolution2dForwardOutputDim(raw_conv, x.get(), raw_w, &n, &c, &h, &wd));
    PIPIT_CHECK(Shape({n, c, h, wd}) == yt.shape(), op, ": cuDNN computes an output of shape ",
                shape_str({n, c, h, wd}), ", the output given has shape ", shape_str(yt.shape()));
  }

  static TensorDesc tensor(const char* op, const Tensor& t, cudnnDataType_t type) {
    cudnnTensorDescriptor_t raw = nullptr;
    PIPIT_CUDNN_CHECK(op, cudnnCreateTensorDescriptor(&raw));
    TensorDesc owned(raw);
    const Shape& s = t.shape();
    PIPIT_CUDNN_CHECK(
        op, cudnnSetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, type, as_int(op, s[0]),
                                       as_int(op, s[1]), as_int(op, s[2]), as_int(op, s[3])));
    return owned;
  }
};

// cuDNN's candidates (fastest first) in the order tried: deterministic ones first; for f32
// never one that rounds operands to TF32, and run with FMA math, because DEFAULT_MATH lets
// cuDNN use TF32 for f32 on sm_80 and later.
template <typename Perf>
std::vector<Perf> candidates(const std::vector<Perf>& ranked, bool f32) {
  std::vector<Perf> order;
  for (const bool deterministic : {true, false}) {
    for (const Perf& p : ranked) {
      const bool tensor_ops =
          p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
      if (p.status == CUDNN_STATUS_SUCCESS && !(f32 && tensor_ops) &&
          (p.determinism == CUDNN_DETERMINISTIC) == deterministic) {
        order.push_back(p);
        if (f32) order.back().mathType = CUDNN_FMA_MATH;
      }
    }
  }
  return order;
}

// Runs the first candidate whose workspace can be allocated: the fastest algorithms may want
// more memory than the device has left, and a slower one is better than failing.
template <typename Perf, typename WorkspaceSize, typename Launch>
void run_first_fitting(const char* op, int device, cudnnConvolutionDescriptor_t conv,
                       const std::vector<Perf>& order, WorkspaceSize workspace_size,
                       Launch launch) {
  PIPIT_CHECK(!order.empty(), op, ": cuDNN offers no usable algorithm for this convolution");
  for (size_t i = 0; i < order.size(); ++i) {
    // cuDNN picks kernels by algorithm and math type together.
    PIPIT_CUDNN_CHECK(op, cudnnSetConvolutionMathType(conv, order[i].mathType));
    const size_t bytes = workspace_size(order[i].algo);
    std::shared_ptr<Storage> workspace;
    try {
      if (bytes > 0) workspace = cuda::allocate(device, bytes);
    } catch (const Error&) {
      if (i + 1 < order.size()) continue;
      throw;
    }
    // The workspace returns to the cache when this returns, while the GPU may still use it:
    // the allocator hands a block out again only in its stream's order (cuda_device.h).
    launch(order[i].algo, workspace ? workspace->data() : nullptr, bytes);
    return;
  }
}

enum class Pass { forward, backward_data, backward_filter };

// One pass's call: its descriptors, cuDNN handle (locked, on the current stream) and data.
struct PassCall {
  const char* op;
  int device;
  const Descriptors& d;
  cudnnHandle_t h;
  const Tensor &x, &w, &y;
  bool f32;
  const void *alpha, *beta;
};

// cuDNN's ranked algorithms of a pass, in its Perf type, as `rank(max, &count, perfs)` lists.
template <typename Perf, typename Rank>
std::vector<Perf> ranked(const char* op, int max_count, Rank rank) {
  std::vector<Perf> perfs(static_cast<size_t>(max_count));
  int count = 0;
  PIPIT_CUDNN_CHECK(op, rank(max_count, &count, perfs.data()));
  perfs.resize(static_cast<size_t>(count));
  return perfs;
}

void forward_pass(const PassCall& c) {
  const Descriptors& d = c.d;
  int max_count = 0;
  PIPIT_CUDNN_CHECK(c.op, cudnnGetConvolutionForwardAlgorithmMaxCount(c.h, &max_count));
  const auto perfs = ranked<cudnnConvolutionFwdAlgoPerf_t>(c.op, max_count, [&](auto... args) {
    return cudnnGetConvolutionForwardAlgorithm_v7(c.h, d.x.get(), d.w.get(), d.conv.get(),
                                                  d.y.get(), args...);
  });
  run_first_fitting(
      c.op, c.device, d.conv.get(), candidates(perfs, c.f32),
      [&](cudnnConvolutionFwdAlgo_t algo) {
        size_t bytes = 0;
        PIPIT_CUDNN_CHECK(
            c.op, cudnnGetConvolutionForwardWorkspaceSize(c.h, d.x.get(), d.w.get(), d.conv.get(),
                                                          d.y.get(), algo, &bytes));
        return bytes;
      },
      [&](cudnnConvolutionFwdAlgo_t algo, void* workspace, size_t bytes) {
        PIPIT_CUDNN_CHECK(
            c.op, cudnnConvolutionForward(c.h, c.alpha, d.x.get(), c.x.raw_data(), d.w.get(),
                                          c.w.raw_data(), d.conv.get(), algo, workspace, bytes,
                                          c.beta, d.y.get(), c.y.raw_data()));
      });
}

void backward_data_pass(const PassCall& c) {
  const Descriptors& d = c.d;
  int max_count = 0;
  PIPIT_CUDNN_CHECK(c.op, cudnnGetConvolutionBackwardDataAlgorithmMaxCount(c.h, &max_count));
  const auto perfs = ranked<cudnnConvolutionBwdDataAlgoPerf_t>(c.op, max_count, [&](auto... args) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(c.h, d.w.get(), d.y.get(), d.conv.get(),
                                                       d.x.get(), args...);
  });
  run_first_fitting(
      c.op, c.device, d.conv.get(), candidates(perfs, c.f32),
      [&](cudnnConvolutionBwdDataAlgo_t algo) {
        size_t bytes = 0;
        PIPIT_CUDNN_CHECK(c.op,
                          cudnnGetConvolutionBackwardDataWorkspaceSize(
                              c.h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), algo, &bytes));
        return bytes;
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, void* workspace, size_t bytes) {
        PIPIT_CUDNN_CHECK(
            c.op, cudnnConvolutionBackwardData(c.h, c.alpha, d.w.get(), c.w.raw_data(), d.y.get(),
                                               c.y.raw_data(), d.conv.get(), algo, workspace, bytes,
                                               c.beta, d.x.get(), c.x.raw_data()));
      });
}

void backward_filter_pass(const PassCall& c) {
  const Descriptors& d = c.d;
  int max_count = 0;
  PIPIT_CUDNN_CHECK(c.op, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(c.h, &max_count));
  const auto perfs =
      ranked<cudnnConvolutionBwdFilterAlgoPerf_t>(c.op, max_count, [&](auto... args) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(c.h, d.x.get(), d.y.get(),
                                                             d.conv.get(), d.w.get(), args...);
      });
  run_first_fitting(
      c.op, c.device, d.conv.get(), candidates(perfs, c.f32),
      [&](cudnnConvolutionBwdFilterAlgo_t algo) {
        size_t bytes = 0;
        PIPIT_CUDNN_CHECK(c.op,
                          cudnnGetConvolutionBackwardFilterWorkspaceSize(
                              c.h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), algo, &bytes));
        return bytes;
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, void* workspace, size_t bytes) {
        PIPIT_CUDNN_CHECK(
            c.op, cudnnConvolutionBackwardFilter(c.h, c.alpha, d.x.get(), c.x.raw_data(), d.y.get(),
                                                 c.y.raw_data(), d.conv.get(), algo, workspace,
                                                 bytes, c.beta, d.w.get(), c.w.raw_data()));
      });
}

// One pass of the convolution between contiguous x, w and y; the pass writes one of them
// (forward y, backward_data x, backward_filter w) and reads the other two.
void convolve(Pass pass, const char* op, int device, const Tensor& x, const Tensor& w,
              const Tensor& y, const Conv2dGeometry& g) {
  const Tensor& out = pass == Pass::forward ? y : pass == Pass::backward_data ? x : w;
  PIPIT_CHECK(out.is_contiguous(), op, ": output must be contiguous");
  if (out.numel() == 0) return;
  if (x.numel() == 0 || w.numel() == 0 || y.numel() == 0) {
    // An empty sum (no samples, channels or output positions), which cuDNN does not accept.
    backend(out).fill(out, 0.0);
    return;
  }
  const Descriptors d(op, x, w, y, g);
  const bool f32 = x.dtype() == DType::f32;
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  cuda::DnnHandle& dnn = cuda::dnn_handle(op, device);
  std::lock_guard<std::mutex> lock(dnn.mutex);
  cuda::use_current_stream(op, dnn, device);
  PIPIT_CUDNN_CHECK(
      op, cudnnSetConvolutionMathType(d.conv.get(), f32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH));
  // alpha = 1, beta = 0 in the data's type: out is overwritten, never read.
  const PassCall call{op,
                      device,
                      d,
                      dnn.handle,
                      x,
                      w,
                      y,
                      f32,
                      f32 ? static_cast<const void*>(&one_f) : &one_d,
                      f32 ? static_cast<const void*>(&zero_f) : &zero_d};
  if (pass == Pass::forward) return forward_pass(call);
  if (pass == Pass::backward_data) return backward_data_pass(call);
  backward_filter_pass(call);
}

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& geometry,
                         const Tensor& out) {
  cuda::DeviceGuard guard(index_);
  convolve(Pass::forward, "conv2d", index_, dense(x), dense(weight), out, geometry);
}

void CudaBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& weight,
                                        const Conv2dGeometry& geometry, const Tensor& grad_x) {
  cuda::DeviceGuard guard(index_);
  convolve(Pass::backward_data, "conv2d_backward_input", index_, grad_x, dense(weight),
           dense(grad_out), geometry);
}

void CudaBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x,
                                         const Conv2dGeometry& geometry,
                                         const Tensor& grad_weight) {
  cuda::DeviceGuard guard(index_);
  convolve(Pass::backward_filter, "conv2d_backward_weight", index_, dense(x), grad_weight,
           dense(grad_out), geometry);
}

}  // namespace pipit
