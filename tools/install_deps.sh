#!/usr/bin/env bash
# Installs pipit's build and test dependencies from Debian's packages (and, for CUDA builds,
# the cuDNN frontend's headers from PyPI). Idempotent: packages already present are not
# touched and apt is not even updated.
# Usage: tools/install_deps.sh [--with-torch] [--with-chromium] [--with-slurm]
# (python3-torch is only needed for regenerating reference values and for bench/cpu_vs_torch;
# chromium only for tools/screenshot_report.sh, which checks pipit-report's page in a real
# browser; slurm-wlm and munge only for tools/slurm_local.sh, a one-node Slurm for srun)
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
for option in "$@"; do
  case "$option" in
    --with-torch) packages+=(python3-torch python3-numpy) ;;
    --with-chromium) packages+=(chromium) ;;
    --with-slurm) packages+=(slurm-wlm munge) ;;
    *) echo "install_deps: unknown option '$option' (see the usage at the top)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
if ((${#missing[@]} == 0)); then
  echo "install_deps: all Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  if [[ " ${missing[*]} " == *" iperf3 "* ]]; then
    echo "iperf3 iperf3/start_daemon boolean false" | "${sudo_cmd[@]}" debconf-set-selections
  fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA builds (where nvcc is): cuDNN's fused attention goes through the cuDNN frontend, a
# header-only C++ API that only PyPI carries (the nvidia-cudnn-frontend wheel, pinned here).
# Its headers are unpacked under /opt/cudnn-frontend, where CMake looks. Without them (no
# network, no pip) pipit builds with its own attention kernels only.
frontend_version=1.32.0
frontend_dir=/opt/cudnn-frontend
if command -v nvcc >/dev/null && [[ ! -f $frontend_dir/version-$frontend_version ]]; then
  wheels=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
      "nvidia-cudnn-frontend==$frontend_version"; then
    python3 -m zipfile -e "$wheels"/nvidia_cudnn_frontend-*.whl "$wheels/unpacked"
    "${sudo_cmd[@]}" rm -rf "$frontend_dir"
    "${sudo_cmd[@]}" mkdir -p "$frontend_dir"
    "${sudo_cmd[@]}" cp -r "$wheels/unpacked/include" "$frontend_dir/"
    "${sudo_cmd[@]}" touch "$frontend_dir/version-$frontend_version"
    echo "install_deps: cuDNN frontend $frontend_version headers in $frontend_dir/include"
  else
    echo "install_deps: could not fetch nvidia-cudnn-frontend $frontend_version from PyPI;" \
      "CUDA builds will use pipit's own attention kernels only" >&2
  fi
  rm -rf "$wheels"
fi
