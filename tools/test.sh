#!/usr/bin/env bash
# Builds pipit and runs every test: the Catch2 suite through ctest (Release), the same suite
# under AddressSanitizer + UndefinedBehaviorSanitizer, a consumer project that links the
# installed library through find_package(pipit), then every libFuzzer harness briefly
# (PIPIT_FUZZ_SECONDS each, default 10; tests/fuzz/run.sh runs them at length by hand).
# Exits non-zero on any failure.
# Set PIPIT_SKIP_SANITIZE=1 to skip the sanitizer pass and PIPIT_SKIP_FUZZ=1 to skip the
# fuzzers while iterating.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
# Each phase's heading says how long the run has taken so far: CI's time is kept short.
phase() { echo "=== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s) ==="; }

bash tools/install_deps.sh

phase "Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
phase "Release tests"
ctest --test-dir build --output-on-failure -j"$jobs"
# ctest shows a skipped CUDA test as passed; the suite's own warnings tell how many skipped.
phase "CUDA tests: cases that ran vs skipped"
./build/pipit_tests "[cuda]" 2>&1 | grep -E "skipped: |^test cases|^All tests passed" | sort | uniq -c

phase "installed library: find_package(pipit) from a separate project"
rm -rf build/install build/consumer
cmake --install build --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
cmake --build build/consumer -j"$jobs" >/dev/null
./build/consumer/consumer

# One clang build (build-sanitize, ASan + UBSan, -O1) serves both the sanitizer pass and the
# fuzzers: tests/fuzz/run.sh configures it with the same options, so it compiles nothing again.
# The CUDA tests run in the Release build above; OpenBLAS does the GEMMs here because clang's
# OpenMP runtime and the GNU one oneDNN is built against should not share a process.
sanitize_build=build-sanitize
if [[ "${PIPIT_SKIP_SANITIZE:-0}" != "1" ]]; then
  phase "ASan + UBSan build (clang)"
  cmake -S . -B "$sanitize_build" -DCMAKE_CXX_COMPILER=clang++ -DPIPIT_SANITIZE=ON \
        -DPIPIT_FUZZ=ON -DPIPIT_CUDA=OFF -DPIPIT_GEMM=OPENBLAS -DPIPIT_BUILD_SAMPLES=OFF \
        -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" >/dev/null
  cmake --build "$sanitize_build" -j"$jobs"
  phase "ASan + UBSan tests"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$sanitize_build" --output-on-failure -j"$jobs"
fi

if [[ "${PIPIT_SKIP_FUZZ:-0}" != "1" ]]; then
  phase "libFuzzer harnesses, ${PIPIT_FUZZ_SECONDS:-10} s each"
  PIPIT_FUZZ_BUILD="$sanitize_build" bash tests/fuzz/run.sh "${PIPIT_FUZZ_SECONDS:-10}"
fi
phase "done"
