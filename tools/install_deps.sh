#!/usr/bin/env bash
# Installs pipit's build and test dependencies from Debian's packages.
# Idempotent: packages already present are not touched and apt is not even updated.
# Usage: tools/install_deps.sh [--with-torch]   (python3-torch is only needed for
# regenerating reference values and for bench/cpu_vs_torch)
set -euo pipefail

packages=(cmake g++ make pkg-config libopenblas-dev nlohmann-json3-dev libasio-dev catch2 python3)
# CPU f32 GEMM on AVX-512 machines (tensor/cpu/matmul.cpp): oneDNN.
packages+=(libdnnl-dev)
# The fuzz build (tests/fuzz/run.sh): clang, its sanitizer and libFuzzer runtimes
# (libclang_rt.fuzzer*.a come from libclang-rt-14-dev, which libclang-rt-dev pulls in) and
# clang's OpenMP runtime.
packages+=(clang libclang-rt-dev libomp-dev)
# The MPI transport (comm/mpi/) and its tests: Open MPI's headers, libraries and mpirun.
packages+=(libopenmpi-dev openmpi-bin)
# The network-namespace cluster (tests/netns_test.cpp, samples/netns_cluster.sh): ip and tc.
packages+=(iproute2)
# bench/tcp_throughput's loopback ceiling. Its package asks whether to start an iperf3 daemon
# at boot; the answer is preseeded to no, so nothing listens behind the benchmark's back.
packages+=(iperf3)
if [[ "${1:-}" == "--with-torch" ]]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all dependencies present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "install_deps: installing ${missing[*]}"
if [[ " ${missing[*]} " == *" iperf3 "* ]]; then
  echo "iperf3 iperf3/start_daemon boolean false" | "${sudo_cmd[@]}" debconf-set-selections
fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
