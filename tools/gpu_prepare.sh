#!/usr/bin/env bash
# Everything a lent GPU needs from this machine, in one command: the mutants that
# tools/gpu_check.sh's mutants step runs (tools/gpu_mutants.sh; a few minutes each), then
# ../shared/tools/gpu_pack.sh's archive of the build with them and the benchmarks.
#
# usage: bash tools/gpu_prepare.sh [BUILD_DIR] [ARCHIVE]
#   BUILD_DIR: a Release build with CUDA, built (default build); ARCHIVE: default
#   .gpu/pack.tar.xz (put /.gpu/ in .git/info/exclude). PIPIT_MUTANTS: the names of the
#   mutants to build and pack (default all; each relinks pipit_tests, minutes on two cores).
#   On the GPU machine, as gpu_pack.sh's header says: unpack, set LD_LIBRARY_PATH, run
#   tools/gpu_check.sh (or tools/gpu_quick.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
archive=${2:-.gpu/pack.tar.xz}
pack=../shared/tools/gpu_pack.sh
[[ -x $build/pipit_tests ]] || { echo "gpu_prepare: $build/pipit_tests missing: build first" >&2; exit 1; }
[[ -f $pack ]] || { echo "gpu_prepare: $pack missing" >&2; exit 1; }

# shellcheck source=tools/gpu_mutants.sh
source tools/gpu_mutants.sh
names=()
for ((i = 0; i < ${#gpu_mutants[@]}; i += 4)); do
  [[ -n ${PIPIT_MUTANTS:-} && " $PIPIT_MUTANTS " != *" ${gpu_mutants[i]} "* ]] && continue
  bash tools/build_mutant.sh "$build" pipit_tests "${gpu_mutants[i + 1]}" "${gpu_mutants[i + 2]}" \
    "${gpu_mutants[i]}"
  names+=("${gpu_mutants[i]}")
done

mkdir -p "$(dirname "$archive")"
# A dictionary as large as the binaries, so that xz stores each mutant as the few bytes it
# differs by from pipit_tests, and the archive stays under the device tool's 64 MiB.
export XZ_OPT=${XZ_OPT:---lzma2=preset=6,dict=128MiB}
bash "$pack" "$build" "$archive" pipit_tests "${names[@]}" train_gpt gpu_gemm gpu_gpt2 \
  gpu_kernels gpu_attention gpu_linear generate_speed
