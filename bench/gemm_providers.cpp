// The GEMM providers pipit can call, side by side on pipit's own shapes, one thread each:
// OpenBLAS (cblas_sgemm), oneDNN (dnnl_sgemm, when pipit's build found it) and BLIS
// (bli_sgemm, when libblis-dev is installed: bench-only, not one of pipit's dependencies). For each
// shape: GFLOP/s (2*M*N*K per call) and the share of the measured FP32 peak of one core, the
// providers taking turns round by round, best round each. Every provider's result is checked
// against OpenBLAS's before it is timed. The last column is pipit's bf16 product (bf16
// operands, f32 sums: autocast's) on the AVX512_BF16 dot product, against the measured bf16
// dot-product peak, where the CPU has it.
//
// usage: build/gemm_providers [--rounds 5] [--append]
#include <cblas.h>
#ifdef PIPIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#endif
#if __has_include(<blis.h>)
#include <blis.h>
#define PIPIT_HAVE_BLIS
#endif
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/results.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/peak_flops.h"
#include "tensor/cpu/cpu_backend.h"

namespace {

struct Shape {
  const char* name;
  int M, N, K;
  bool ta, tb;  // A is stored [K, M] / B is stored [N, K] (pipit's Linear weight)
};

// Every GEMM of the two cpu_vs_torch models, one of each distinct shape, plus a square one.
const std::vector<Shape> kShapes = {
    {"mlp fc1 forward x.W^T", 256, 1024, 784, false, true},
    {"mlp fc2 forward x.W^T", 256, 1024, 1024, false, true},
    {"mlp fc3 forward x.W^T", 256, 10, 1024, false, true},
    {"mlp fc2 grad_x dy.W", 256, 1024, 1024, false, false},
    {"mlp fc3 grad_x dy.W", 256, 1024, 10, false, false},
    {"mlp fc1 grad_W dy^T.x", 1024, 784, 256, true, false},
    {"mlp fc2 grad_W dy^T.x", 1024, 1024, 256, true, false},
    {"mlp fc3 grad_W dy^T.x", 10, 1024, 256, true, false},
    {"gpt qkv forward", 2048, 384, 128, false, true},
    {"gpt mlp-in forward", 2048, 512, 128, false, true},
    {"gpt mlp-out forward", 2048, 128, 512, false, true},
    {"gpt head forward", 2048, 65, 128, false, true},
    {"gpt mlp-out grad_x", 2048, 512, 128, false, false},
    {"gpt mlp-in grad_W", 512, 128, 2048, true, false},
    {"gpt attention q.k^T", 128, 128, 32, false, true},
    {"gpt attention p.v", 128, 32, 128, false, false},
    {"square 1024", 1024, 1024, 1024, false, false},
};

#ifdef PIPIT_HAVE_BLIS
// BLIS is loaded privately (RTLD_LOCAL): linked, its cblas_sgemm would stand in for
// OpenBLAS's.
struct Blis {
  decltype(&bli_sgemm) sgemm = nullptr;
  decltype(&bli_thread_set_num_threads) set_num_threads = nullptr;
  decltype(&bli_arch_query_id) arch_id = nullptr;
  decltype(&bli_arch_string) arch_string = nullptr;
};

const Blis& blis() {
  static const Blis loaded = [] {
    Blis b;
    void* lib = dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return b;
    b.sgemm = reinterpret_cast<decltype(&bli_sgemm)>(dlsym(lib, "bli_sgemm"));
    b.set_num_threads = reinterpret_cast<decltype(&bli_thread_set_num_threads)>(
        dlsym(lib, "bli_thread_set_num_threads"));
    b.arch_id = reinterpret_cast<decltype(&bli_arch_query_id)>(dlsym(lib, "bli_arch_query_id"));
    b.arch_string = reinterpret_cast<decltype(&bli_arch_string)>(dlsym(lib, "bli_arch_string"));
    if (!b.set_num_threads || !b.arch_id || !b.arch_string) b.sgemm = nullptr;
    return b;
  }();
  return loaded;
}
#endif

using Gemm = std::function<void(const Shape&, const float*, const float*, float*)>;

struct Provider {
  std::string name;
  Gemm gemm;
};

int lda_of(const Shape& s) {
  return s.ta ? s.M : s.K;
}
int ldb_of(const Shape& s) {
  return s.tb ? s.K : s.N;
}

std::vector<Provider> providers() {
  std::vector<Provider> list;
  list.push_back({"OpenBLAS", [](const Shape& s, const float* a, const float* b, float* c) {
                    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans,
                                s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.0f, a, lda_of(s),
                                b, ldb_of(s), 0.0f, c, s.N);
                  }});
#ifdef PIPIT_HAVE_DNNL
  list.push_back({"oneDNN", [](const Shape& s, const float* a, const float* b, float* c) {
                    dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a,
                               lda_of(s), b, ldb_of(s), 0.0f, c, s.N);
                  }});
#endif
#ifdef PIPIT_HAVE_BLIS
  if (blis().sgemm) {
    list.push_back({"BLIS", [](const Shape& s, const float* a, const float* b, float* c) {
                      float one = 1.0f, zero = 0.0f;
                      // BLIS takes strides, so a transposed operand is its strides swapped.
                      blis().sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, s.M, s.N, s.K, &one,
                                   const_cast<float*>(a), s.ta ? 1 : lda_of(s),
                                   s.ta ? lda_of(s) : 1, const_cast<float*>(b),
                                   s.tb ? 1 : ldb_of(s), s.tb ? ldb_of(s) : 1, &zero, c, s.N, 1);
                    }});
  }
#endif
  return list;
}

// GFLOP/s of the best of `calls_per_round` timed calls' mean, repeated until 30 ms passed.
double time_gemm(const Provider& p, const Shape& s, const float* a, const float* b, float* c) {
  using Clock = std::chrono::steady_clock;
  p.gemm(s, a, b, c);
  int calls = 0;
  const auto start = Clock::now();
  double seconds = 0;
  while (seconds < 0.03) {
    p.gemm(s, a, b, c);
    ++calls;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return 2.0 * s.M * s.N * s.K * calls / seconds / 1e9;
}

// pipit's bf16 product of the shape's operands (rounded to bf16), into f32, on one thread.
struct Bf16Product {
  pipit::Tensor a, b, out;
  Bf16Product(const Shape& s, const std::vector<float>& av, const std::vector<float>& bv) {
    using pipit::DType;
    a = pipit::from_vector(av, {s.ta ? s.K : s.M, s.ta ? s.M : s.K}).to(DType::bf16);
    b = pipit::from_vector(bv, {s.tb ? s.N : s.K, s.tb ? s.K : s.N}).to(DType::bf16);
    if (s.ta) a = pipit::transpose(a, 0, 1);
    if (s.tb) b = pipit::transpose(b, 0, 1);
    out = pipit::Tensor::empty({s.M, s.N});
  }
  void run() const { pipit::backend(a).matmul(a, b, out, false); }
};

// GFLOP/s of pipit's bf16 product, timed as time_gemm times the providers.
double time_bf16(const Shape& s, const Bf16Product& product) {
  Provider p{"pipit bf16",
             [&](const Shape&, const float*, const float*, float*) { product.run(); }};
  return time_gemm(p, s, nullptr, nullptr, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  pipit::support::Flags flags(
      "gemm_providers",
      "Times f32 GEMM per provider (OpenBLAS, oneDNN, BLIS) against one core's "
      "measured peak, on the shapes pipit's models run.");
  flags.add("rounds", "5", "timed rounds per shape (the median is kept)");
  flags.add_switch("append", "append the table to bench/RESULTS.md");
  flags.parse(argc, argv);
  const int rounds = static_cast<int>(flags.integer("rounds"));
  const bool append = flags.on("append");
  // One thread everywhere: OpenBLAS's own pool, BLIS's, and the OpenMP one oneDNN uses.
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
#ifdef PIPIT_HAVE_BLIS
  if (blis().sgemm) blis().set_num_threads(1);
#endif
  // BLIS exports a cblas_sgemm too: make sure the OpenBLAS column is OpenBLAS.
  Dl_info where{};
  if (!dladdr(reinterpret_cast<void*>(&cblas_sgemm), &where) || !where.dli_fname ||
      !std::strstr(where.dli_fname, "openblas")) {
    std::fprintf(stderr, "gemm_providers: cblas_sgemm resolves to %s, not OpenBLAS\n",
                 where.dli_fname ? where.dli_fname : "(unknown)");
    return 1;
  }
  const pipit::support::Peak peak = pipit::support::measure_peak_gflops();
  const pipit::support::Peak bf16_peak = pipit::support::measure_bf16_peak_gflops();
  const bool bf16 = pipit::cpu_bf16_dot();
  pipit::set_num_threads(1);
  const std::vector<Provider> list = providers();

  std::ostringstream table;
  table << "One thread; FP32 peak of one core measured with an " << peak.isa
        << " FMA loop: " << static_cast<int>(peak.gflops) << " GFLOP/s. "
        << "GFLOP/s (share of peak), best of " << rounds << " rounds, providers in turns";
  {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    table << "; OPENBLAS_CORETYPE=" << (coretype ? coretype : "(unset)");
  }
#ifdef PIPIT_HAVE_DNNL
  table << "; oneDNN ISA " << dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
#endif
#ifdef PIPIT_HAVE_BLIS
  if (blis().sgemm) table << "; BLIS configuration " << blis().arch_string(blis().arch_id());
#endif
  if (bf16) {
    table << "; bf16 dot-product peak of one core (AVX512_BF16 loop): "
          << static_cast<int>(bf16_peak.gflops) << " GFLOP/s";
  }
  table << ".\n\n| shape | M x N x K |";
  for (const Provider& p : list) table << " " << p.name << " |";
  if (bf16) table << " pipit bf16 dot (share of bf16 peak) |";
  table << "\n|---|---|";
  for (size_t i = 0; i < list.size() + (bf16 ? 1 : 0); ++i) table << "---|";
  table << "\n";

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const Shape& s : kShapes) {
    std::vector<float> a(static_cast<size_t>(s.M) * s.K), b(static_cast<size_t>(s.K) * s.N);
    for (float& v : a) v = uniform(rng);
    for (float& v : b) v = uniform(rng);
    std::vector<float> reference(static_cast<size_t>(s.M) * s.N), c(reference.size());
    list[0].gemm(s, a.data(), b.data(), reference.data());
    for (const Provider& p : list) {
      std::fill(c.begin(), c.end(), NAN);
      p.gemm(s, a.data(), b.data(), c.data());
      for (size_t i = 0; i < c.size(); ++i) {
        if (!(std::abs(c[i] - reference[i]) <= 1e-4f * (1.0f + std::abs(reference[i])) * s.K)) {
          std::fprintf(stderr, "%s: %s differs from OpenBLAS at %zu: %g vs %g\n", p.name.c_str(),
                       s.name, i, c[i], reference[i]);
          return 1;
        }
      }
    }
    const Bf16Product product(s, a, b);
    if (bf16) {
      product.run();
      const std::vector<float> got = product.out.to_vector<float>();
      for (size_t i = 0; i < got.size(); ++i) {
        // bf16 operands carry 8 bits: each product is off by up to 2^-7 of |a b| <= 1.
        if (!(std::abs(got[i] - reference[i]) <= std::ldexp(1.0f, -7) * s.K)) {
          std::fprintf(stderr, "pipit bf16: %s differs from OpenBLAS at %zu: %g vs %g\n", s.name, i,
                       got[i], reference[i]);
          return 1;
        }
      }
    }
    std::vector<double> best(list.size() + 1, 0.0);
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < list.size(); ++i) {
        best[i] = std::max(best[i], time_gemm(list[i], s, a.data(), b.data(), c.data()));
      }
      if (bf16) best.back() = std::max(best.back(), time_bf16(s, product));
    }
    std::ostringstream row;
    row << "| " << s.name << (s.ta ? " (A^T)" : "") << (s.tb ? " (B^T)" : "") << " | " << s.M
        << " x " << s.N << " x " << s.K << " |";
    for (size_t i = 0; i < list.size(); ++i) {
      char cell[64];
      std::snprintf(cell, sizeof cell, " %.0f (%.0f%%) |", best[i], 100.0 * best[i] / peak.gflops);
      row << cell;
    }
    if (bf16) {
      char cell[64];
      std::snprintf(cell, sizeof cell, " %.0f (%.0f%%) |", best.back(),
                    100.0 * best.back() / bf16_peak.gflops);
      row << cell;
    }
    std::printf("%s\n", row.str().c_str());
    std::fflush(stdout);
    table << row.str() << "\n";
  }
  std::printf("\n%s", table.str().c_str());
  if (append) pipit::bench::append_results("gemm_providers", table.str());
  return 0;
}
