// Matrix products through oneDNN's sgemm or OpenBLAS. Each operand is passed to GEMM as it
// lies in memory when its last two dims are row- or column-major; only other layouts are
// copied first.
//
// Which library (set_cpu_gemm_provider; bench/gemm_providers measures both on pipit's shapes):
// on a CPU with AVX-512, oneDNN, which dispatches on the instructions the CPU reports, while
// OpenBLAS's choice of kernels can be held to AVX2 by OPENBLAS_CORETYPE, which some machines
// set for reasons of their own. On an AVX2-only CPU both run AVX2 kernels, and OpenBLAS's
// packing copes better with operands whose row strides are powers of two (oneDNN's sgemm runs
// at half speed on several of the MLP's transposed shapes), so OpenBLAS, except for small
// products (up to kSmallProduct multiply-adds, such as attention's per-head products): there
// OpenBLAS's fixed work per call, a pass zeroing C when beta = 0 and packing both operands,
// is a large share, and oneDNN runs them at about 0.9 of peak against OpenBLAS's 0.55-0.7.
// f64 is always OpenBLAS.
//
// The GEMM library runs single threaded (see set_num_threads, and OneThread below): a second
// thread pool would spin against pipit's OpenMP threads for the same cores. Products are split
// here instead, into tiles of the output whose bounds depend only on the shape, each tile one
// GEMM call, so every element comes from the same call whatever the thread count.
#include <cblas.h>
#include <omp.h>
#ifdef PIPIT_GEMM_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include <atomic>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/loop.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/gemm_layout.h"
#include "tensor/kernel_layout.h"

namespace pipit {
namespace {

// Multiply-adds per tile below which a thread is not worth waking.
constexpr int64_t kTileWork = int64_t{1} << 23;
// Each tile packs its own copy of its rows of A and columns of B, a cost that a single thread
// pays too; 4 tiles (a power of two, to balance over 2 or 4 threads) keep it to a few percent.
constexpr int64_t kMaxTiles = 4;
// Tile edges are multiples of BLAS micro-kernel widths, so that only the matrix's own edge
// takes the slower edge kernels.
constexpr int64_t kTileAlign = 16;
// A product of few rows (generation's one token per row) is bound by reading B, not by its
// multiply-adds: it is costed as if it had this many rows, so B's columns are split over the
// threads and their memory bandwidth.
constexpr int64_t kBandwidthRows = 16;

// The multiply-adds a product is costed at (see kBandwidthRows).
int64_t gemm_work(int64_t M, int64_t N, int64_t K) {
  return std::max(M, kBandwidthRows) * N * K;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

struct Tiling {
  int64_t rows = 0, cols = 0;  // of one tile; the last row and column of tiles may be short
  int64_t row_tiles = 1, col_tiles = 1;
  int64_t count() const { return row_tiles * col_tiles; }
};

Tiling tiling_for(int64_t M, int64_t N, int64_t K, int64_t max_tiles) {
  int64_t want = 1;
  while (want < max_tiles && 2 * want * kTileWork <= gemm_work(M, N, K)) want *= 2;
  const int64_t max_rt = ceil_div(M, kTileAlign), max_ct = ceil_div(N, kTileAlign);
  // The most tiles, then the least packing: each row of tiles packs all of B once more, each
  // column of tiles all of A.
  int64_t best_rt = 1, best_ct = 1, best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t rt = 1; rt <= std::min(want, max_rt); ++rt) {
    const int64_t ct = std::min(want / rt, max_ct);
    const int64_t cost = ct * M + rt * N;
    if (rt * ct > best_rt * best_ct || (rt * ct == best_rt * best_ct && cost < best_cost)) {
      best_rt = rt;
      best_ct = ct;
      best_cost = cost;
    }
  }
  Tiling t;
  t.rows = ceil_div(ceil_div(M, best_rt), kTileAlign) * kTileAlign;
  t.cols = ceil_div(ceil_div(N, best_ct), kTileAlign) * kTileAlign;
  t.row_tiles = ceil_div(M, t.rows);
  t.col_tiles = ceil_div(N, t.cols);
  return t;
}

#ifdef PIPIT_GEMM_ONEDNN
// oneDNN sizes its OpenMP team from the calling thread's setting; one thread per call keeps a
// tile's result independent of how many threads pipit runs.
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};
#endif

std::atomic<GemmProvider> g_provider{GemmProvider::automatic};

// Whether a product of `work` multiply-adds goes to oneDNN.
bool use_onednn(int64_t work) {
#ifdef PIPIT_GEMM_ONEDNN
  switch (g_provider.load(std::memory_order_relaxed)) {
    case GemmProvider::onednn:
      return true;
    case GemmProvider::openblas:
      return false;
    case GemmProvider::automatic:
      break;
  }
#ifdef PIPIT_GEMM_ONEDNN_ALWAYS
  (void)work;
  return true;
#else
  // Products up to this many multiply-adds go to oneDNN on AVX2 CPUs too (see the top).
  constexpr int64_t kSmallProduct = int64_t{1} << 20;
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 || work <= kSmallProduct;
#endif
#else
  (void)work;
  return false;
#endif
}

Tensor gemm_ready(const Tensor& t) {
  // A contiguous tensor always qualifies, so the fallback is always a copy.
  return layout_of(t).usable ? t : dense(t);
}

// One tile's GEMM: f32 and f64 through the library, bf16 operands (their bits, as uint16_t)
// on the dot product, into f32 or rounded into bf16 (Out uint16_t, with the bias).
template <typename T, typename Out>
void gemm_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda,
               const T* b, int64_t ldb, Out beta, Out* c, int64_t ldc, const float* bias) {
  if constexpr (std::is_same_v<Out, uint16_t>) {
    cpu::gemm_bf16_rounded(ta, tb, M, N, K, a, lda, b, ldb, bias, c, ldc);
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    cpu::gemm_bf16(ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc);
  } else {
    cpu::gemm<T>(ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc);
  }
}

// out = a b (+ out when accumulating), operands of element type T (uint16_t: bf16 bits, whose
// products are f32), out of element type Out (for bf16 operands f32, or bf16 bits with `bias`,
// rounded in the kernel).
template <typename T, typename Out = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>>
void matmul_typed(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate,
                  const float* bias = nullptr) {
  const Out beta = accumulate ? Out(1) : Out(0);
  const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  const int64_t r = out.dim();
  const int64_t M = out.shape()[r - 2], N = out.shape()[r - 1], K = a.shape()[r - 1];
  Out* c = static_cast<Out*>(out.raw_data());
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) std::fill(c, c + out.numel(), Out(0));
    return;
  }
  const BatchFold fold = batch_fold(a, la, b, out);
  const int64_t rows = fold.folds ? M * fold.batch : M, products = fold.folds ? 1 : fold.batch;
  // The bf16 kernel's sums do not depend on how a product is cut (its depth blocks start at 0
  // in every tile), so it is cut only as many ways as threads may run, each cut packing again.
  const int64_t max_tiles =
      std::is_same_v<T, uint16_t> ? std::min<int64_t>(kMaxTiles, get_num_threads()) : kMaxTiles;
  const Tiling tiling = tiling_for(rows, N, K, max_tiles);
  auto run_tile = [&](int64_t task) {
    int64_t off_a = 0, off_b = 0;
    for (int64_t d = r - 3, rest = task / tiling.count(); d >= 0; --d) {
      const int64_t i = rest % out.shape()[d];
      rest /= out.shape()[d];
      off_a += i * a.strides()[d];
      off_b += i * b.strides()[d];
    }
    const int64_t tile = task % tiling.count();
    const int64_t r0 = tile / tiling.col_tiles * tiling.rows;
    const int64_t c0 = tile % tiling.col_tiles * tiling.cols;
    off_a += la.transposed ? r0 : r0 * la.ld;
    off_b += lb.transposed ? c0 * lb.ld : c0;
    gemm_call(la.transposed, lb.transposed, std::min(tiling.rows, rows - r0),
              std::min(tiling.cols, N - c0), K, pa + off_a, la.ld, pb + off_b, lb.ld, beta,
              c + task / tiling.count() * M * N + r0 * N + c0, N, bias ? bias + c0 : nullptr);
  };
  const int64_t tasks = products * tiling.count();
  const int threads = static_cast<int>(
      std::min<int64_t>({get_num_threads(), tasks,
                         std::max<int64_t>(1, products * gemm_work(rows, N, K) / kTileWork)}));
  cpu::parallel_range(tasks, threads, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) run_tile(task);
  });
}

// Products of at most this many rows by a weight (generation, a token per row) run
// weight_columns (vec_kernels.cpp), which reads the weight once, as it lies, with the
// prefetching such a read needs: the product is bound by reading the weight, which GEMM
// libraries read at a fraction of the memory's speed here. bf16 weights are read as bf16.
constexpr int64_t kFewRows = 16;
// Columns per task: enough work to be worth a thread, few enough to balance.
constexpr int64_t kColumnTile = 64;

// The product above when it applies: a [..., M, K] (f32, or bf16 with a bf16 weight) with rows
// in memory order and b a matrix broadcast over the batch whose transpose is row-major (a
// Linear's weight), f32 out. Each element is one weight_columns sum, so the bits do not depend
// on the thread count.
bool few_rows_by_weight(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const bool f32 = a.dtype() == DType::f32 && b.dtype() == DType::f32;
  const bool bf16 = a.dtype() == DType::bf16 && b.dtype() == DType::bf16;
  if (!(f32 || bf16) || out.dtype() != DType::f32) return false;
  const int64_t r = out.dim();
  const int64_t M = out.shape()[r - 2], N = out.shape()[r - 1], K = a.shape()[r - 1];
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  if (!la.usable || la.transposed || !lb.usable || !lb.transposed) return false;
  const BatchFold fold = batch_fold(a, la, b, out);
  const int64_t rows = M * fold.batch;
  if (!fold.folds || rows > kFewRows || rows == 0 || N == 0 || K == 0) return false;
  // a's rows, packed (and widened from bf16): a few KB.
  std::vector<float> packed(static_cast<size_t>(rows * K));
  const auto* a32 = static_cast<const float*>(a.raw_data());
  const auto* a16 = static_cast<const uint16_t*>(a.raw_data());
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      packed[m * K + k] = f32 ? a32[m * la.ld + k] : bfloat16_to_float(a16[m * la.ld + k]);
    }
  }
  float* c = out.data<float>();
  const float beta = accumulate ? 1.0f : 0.0f;
  const int64_t tiles = ceil_div(N, kColumnTile);
  const int threads = static_cast<int>(std::min<int64_t>(
      {get_num_threads(), tiles, std::max<int64_t>(1, gemm_work(rows, N, K) / kTileWork)}));
  cpu::parallel_range(tiles, threads, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kColumnTile, n1 = std::min(N, end * kColumnTile);
    if (f32) {
      cpu::weight_columns(rows, n0, n1, K, packed.data(), b.data<float>(), lb.ld, beta, c, N);
    } else {
      cpu::weight_columns(rows, n0, n1, K, packed.data(),
                          static_cast<const uint16_t*>(b.raw_data()), lb.ld, beta, c, N);
    }
  });
  return true;
}

}  // namespace

namespace cpu {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  auto trans = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<T, float>) {
#ifdef PIPIT_GEMM_ONEDNN
    if (use_onednn(M * N * K)) {
      OneThread one_thread;
      const dnnl_status_t status =
          dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, a, lda, b, ldb, beta, c, ldc);
      PIPIT_CHECK(status == dnnl_success, "matmul: oneDNN sgemm of ", M, " x ", N, " x ", K,
                  " failed with status ", static_cast<int>(status));
      return;
    }
#endif
    cblas_sgemm(CblasRowMajor, trans(ta), trans(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, trans(ta), trans(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace cpu

void set_cpu_gemm_provider(GemmProvider provider) {
#ifndef PIPIT_GEMM_ONEDNN
  PIPIT_CHECK(provider != GemmProvider::onednn,
              "set_cpu_gemm_provider: this build of pipit has no oneDNN (CMake PIPIT_GEMM; "
              "tools/install_deps.sh installs libdnnl-dev)");
#endif
  g_provider = provider;
}

const char* cpu_gemm_provider() {
  if (use_onednn(std::numeric_limits<int64_t>::max())) return "oneDNN";
  return use_onednn(0) ? "OpenBLAS, oneDNN for small products" : "OpenBLAS";
}

namespace {

// Whether a product of bf16 operands into a bf16 out rounds in the bf16 kernel, without an f32
// stand-in: on the dot product, one depth block deep, more rows than weight_columns takes.
bool rounds_in_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const int64_t K = a.shape()[a.dim() - 1];
  return !accumulate && out.dtype() == DType::bf16 && a.dtype() == DType::bf16 &&
         b.dtype() == DType::bf16 && cpu_bf16_dot() && K > 0 && K <= cpu::kBf16Depth &&
         out.numel() > kFewRows * out.shape()[out.dim() - 1];
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  PIPIT_CHECK(out.is_contiguous(), "matmul: output must be contiguous");
  if (rounds_in_kernel(a, b, out, accumulate))
    return matmul_typed<uint16_t, uint16_t>(a, b, out, false);
  if (is_half(out.dtype())) {
    // A half result is the f32 product rounded once, as cuBLAS writes it.
    Tensor wide = accumulate ? cpu::widened(out) : Tensor::empty(out.shape(), DType::f32);
    matmul(a, b, wide, accumulate);
    return cpu::copy_rounded(wide, out);
  }
  if (few_rows_by_weight(a, b, out, accumulate)) return;
  if (a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && out.dtype() == DType::f32 &&
      cpu_bf16_dot()) {
    return matmul_typed<uint16_t>(a, b, out, accumulate);
  }
  if (is_half(a.dtype())) {
    // Half inputs widen exactly to f32, so an f32 GEMM of the widened copies is the f32
    // accumulation the CUDA backend does on tensor cores.
    return matmul_typed<float>(cpu::widened(a), cpu::widened(b), out, accumulate);
  }
  PIPIT_DISPATCH_FLOAT(a.dtype(), "matmul", matmul_typed<scalar_t>(a, b, out, accumulate));
}

void CpuBackend::matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias,
                             const Tensor& out) {
  check_matmul_with_vector("matmul_bias", a, b, out, bias, b.shape()[1]);
  if (rounds_in_kernel(a, b, out, false)) {
    std::vector<float> wide_bias(static_cast<size_t>(bias.numel()));
    cpu::widen_run(static_cast<const cpu::BFloat16*>(bias.raw_data()), 1, wide_bias.data(),
                   bias.numel());
    return matmul_typed<uint16_t, uint16_t>(a, b, out, false, wide_bias.data());
  }
  // The bias is GEMM's C: a half out gets it widened exactly into an f32 stand-in, so bias +
  // sums round once.
  cpu::into_f32(out, [&](const Tensor& target) {
    copy(rows_of(bias, out.shape()[0]), target);
    matmul(a, b, target, true);
  });
}

void CpuBackend::matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias,
                                  const Tensor& pre, const Tensor& out) {
  check_matmul_with_gelu("matmul_bias_gelu", pre, out);
  matmul_bias(a, b, bias, pre);
  unary(UnaryOp::gelu, pre, out);
}

void CpuBackend::matmul_dgelu(const Tensor& a, const Tensor& b, const Tensor& pre,
                              const Tensor& out) {
  check_matmul_with_vector("matmul_dgelu", a, b, out, Tensor(), 0);
  check_matmul_with_gelu("matmul_dgelu", pre, out);
  matmul(a, b, out, false);
  binary(BinaryOp::gelu_backward, out, pre, out);
}

void CpuBackend::matmul_bias_grad(const Tensor& a, const Tensor& b, const Tensor& out,
                                  const Tensor& bias_grad) {
  check_matmul_with_vector("matmul_bias_grad", a, b, out, bias_grad, a.shape()[0]);
  matmul(a, b, out, false);
  const int64_t over_k[] = {1};
  reduce(ReduceOp::sum, a, over_k, bias_grad);
}

}  // namespace pipit
