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

bash tools/install_deps.sh

echo "=== Release build and tests ==="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# ctest shows a skipped CUDA test as passed; the suite's own warnings tell how many skipped.
echo "=== CUDA tests: cases that ran vs skipped ==="
./build/pipit_tests "[cuda]" 2>&1 | grep -E "skipped: |^test cases|^All tests passed" | sort | uniq -c

echo "=== installed library: find_package(pipit) from a separate project ==="
rm -rf build/install build/consumer
cmake --install build --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
cmake --build build/consumer -j"$jobs" >/dev/null
./build/consumer/consumer

if [[ "${PIPIT_SKIP_SANITIZE:-0}" != "1" ]]; then
  echo "=== ASan + UBSan build and tests ==="
  # Without a GPU the CUDA tests can only skip, so the sanitizer build leaves the CUDA backend
  # out (the Release build above compiled it) and saves its device-code compile.
  sanitize_cuda=AUTO
  if ! nvidia-smi -L >/dev/null 2>&1; then sanitize_cuda=OFF; fi
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DPIPIT_SANITIZE=ON \
        -DCMAKE_CXX_FLAGS="-O1" -DPIPIT_BUILD_SAMPLES=OFF -DPIPIT_CUDA=$sanitize_cuda >/dev/null
  cmake --build build-sanitize -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-sanitize --output-on-failure -j"$jobs"
fi

if [[ "${PIPIT_SKIP_FUZZ:-0}" != "1" ]]; then
  echo "=== libFuzzer harnesses, ${PIPIT_FUZZ_SECONDS:-10} s each ==="
  bash tests/fuzz/run.sh "${PIPIT_FUZZ_SECONDS:-10}"
fi
