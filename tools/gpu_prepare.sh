#!/usr/bin/env bash
# Everything a lent GPU needs from this machine, in one command: the mutants that
# tools/gpu_check.sh's mutants step runs (tools/build_mutant.sh, a few minutes each), then
# ../shared/tools/gpu_pack.sh's archive of the build with them and the benchmarks.
#
# usage: bash tools/gpu_prepare.sh [BUILD_DIR] [ARCHIVE]
#   BUILD_DIR: a Release build with CUDA, built (default build); ARCHIVE: default
#   .gpu/pack.tar.xz (put /.gpu/ in .git/info/exclude). On the GPU machine, as gpu_pack.sh's
#   header says: unpack, set LD_LIBRARY_PATH, run tools/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
archive=${2:-.gpu/pack.tar.xz}
pack=../shared/tools/gpu_pack.sh
[[ -x $build/pipit_tests ]] || { echo "gpu_prepare: $build/pipit_tests missing: build first" >&2; exit 1; }
[[ -f $pack ]] || { echo "gpu_prepare: $pack missing" >&2; exit 1; }

# Each mutant breaks one thing a [cuda] case must catch (gpu_check.sh prints which fail).
mutant() { bash tools/build_mutant.sh "$build" pipit_tests "$1" "$2" "$3"; }
# f32 GEMMs on TF32: the tiny GPT's f32 bound must fail.
mutant tensor/cuda/cuda_backend.cpp 's/float32_matmul_precision() == "high"/true/' \
  pipit_tests_f32_as_tf32
# Casts to bf16 truncating instead of rounding: the tiny GPT's bf16 bound must fail.
mutant tensor/cuda/elementwise.cu \
  's/\[\] __device__(S x) { return from_double<D>(to_double(x)); }/[] __device__(S x) { if constexpr (std::is_same_v<D, __nv_bfloat16>) { return __float2bfloat16_rz(static_cast<float>(to_double(x))); } else { return from_double<D>(to_double(x)); } }/' \
  pipit_tests_bf16_truncated
# The weight gradient's split a no-op: the split case must fail.
mutant tensor/cuda/cuda_backend.cpp 's/if (parts == 1 || tiles >= kSms/if (true || tiles >= kSms/' \
  pipit_tests_split_noop
# A graph's index checks not queued again after a replay: the replay's index case must fail.
mutant tensor/cuda/index_check.cu 's/if (s.queued.empty()) s.queued = checks;/(void)checks;/' \
  pipit_tests_graph_checks_dropped
# A capture's blocks on the default stream's free lists: the graph's memory case must fail.
mutant tensor/cuda/cuda_device.cpp \
  's/void\* stream = current_stream_handle(device);/void* stream = capturing() ? nullptr : current_stream_handle(device);/' \
  pipit_tests_graph_pool_shared
# empty_cache free to take a live graph's blocks: the graph's empty_cache case must fail.
mutant tensor/cuda/cuda_device.cpp 's/c.kept_streams.insert(stream);/(void)stream;/' \
  pipit_tests_graph_blocks_unkept

mkdir -p "$(dirname "$archive")"
# A dictionary as large as the binaries, so that xz stores each mutant as the few bytes it
# differs by from pipit_tests, and the archive stays under the device tool's 64 MiB.
export XZ_OPT=${XZ_OPT:---lzma2=preset=6,dict=128MiB}
bash "$pack" "$build" "$archive" pipit_tests pipit_tests_f32_as_tf32 pipit_tests_bf16_truncated \
  pipit_tests_split_noop pipit_tests_graph_checks_dropped pipit_tests_graph_pool_shared \
  pipit_tests_graph_blocks_unkept train_gpt gpu_gemm gpu_gpt2 gpu_kernels gpu_attention gpu_linear \
  generate_speed
