#!/usr/bin/env python3
"""pipit vs PyTorch and JAX on the CPU: same models, shapes, optimizer rules and thread count.

Runs pipit (build/cpu_vs_torch), PyTorch eager (Debian's python3-torch, at one thread only:
above that its OpenBLAS and OpenMP pools oversubscribe the cores; with --torch2 also PyTorch
2.x from PyPI) and JAX (the whole train step under jax.jit) in turns, round by round,
in one run; takes the median step time of each; prints ms/step, each peer's time over
pipit's (> 1 means pipit is faster) and, for the MLP, the share of the machine's FP32 peak
(2*M*N*K per GEMM over the step time, against a measured FMA loop); appends a dated table to
bench/RESULTS.md. The peers run as their users run them: attention through
F.scaled_dot_product_attention and jax.nn.dot_product_attention where those exist, PyTorch's
AdamW fused where it can be. tiny_op (one add of 1-element tensors) is pipit's C++ API
against the peers' Python APIs, labelled so.

PyTorch 2.x and JAX come from PyPI into virtual environments this script makes outside the
repository, under ~/.cache/pipit-bench (or $PIPIT_BENCH_VENVS): JAX by default (about
100 MB; --no-jax skips it), PyTorch 2.x only with --torch2 (several GB with its CUDA wheels).
Each run is pinned with taskset to as many cores as it has threads.

usage: /usr/bin/python3 bench/cpu_vs_torch.py [--build build] [--rounds 3] [--threads 1,2]
                                              [--no-jax] [--torch2] [--no-append]
                                              [--models mlp,gpt,tiny_op,bf16_ops]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

from bench_common import cpu_name, publish

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["mlp", "gpt", "tiny_op", "bf16_ops"]
# tiny_op times one add of two 1-element tensors: pipit's C++ call against the peers' Python
# call, the cost a user of each API pays per op, not two kernels.
LABEL = {"mlp": "mlp", "gpt": "gpt", "tiny_op": "tiny_op (C++ API vs Python API)",
         "bf16_ops": "bf16_ops (add, mul, gelu of bf16 [4096, 1024])"}
# Debian's PyTorch runs OpenBLAS's thread pool beside its OpenMP one: above one thread the two
# oversubscribe the cores, so it runs at one thread only (PyTorch 2.x has one pool).
ONE_THREAD_ONLY = {"PyTorch (Debian)"}
STEPS = {"mlp": (3, 10), "gpt": (2, 6), "tiny_op": (1, 5), "bf16_ops": (2, 10)}  # (warm-up, timed) per round
UNIT = {"mlp": "ms/step", "gpt": "ms/step", "tiny_op": "us/op", "bf16_ops": "ms/round"}
MLP_SIZES = [784, 1024, 1024, 10]
MLP_BATCH = 256


def mlp_gemm_flops():
    """FLOPs of the GEMMs in one MLP step: every layer's forward and weight gradient, and the
    input gradient of every layer but the first (the data needs none)."""
    total = 0
    for i, (fan_in, fan_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:])):
        one = 2 * MLP_BATCH * fan_in * fan_out
        total += one * (2 if i == 0 else 3)
    return total


def venv_python(name, packages):
    """The python of a virtual environment outside the repository holding `packages`, made
    (with Debian's python3 -m venv and pip from PyPI) the first time it is asked for."""
    root = os.environ.get("PIPIT_BENCH_VENVS",
                          os.path.join(os.path.expanduser("~"), ".cache", "pipit-bench"))
    path = os.path.join(root, name)
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(python):
        print(f"cpu_vs_torch: making {path} with {' '.join(packages)} from PyPI", flush=True)
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    return python


def run_once(argv, model, threads):
    """One warm-up-then-timed run of `model` in a fresh process pinned to `threads` cores."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    warmup, steps = STEPS[model]
    out = subprocess.run(["taskset", "-c", cores, *argv, "--model", model, "--threads", str(threads),
                          "--warmup", str(warmup), "--steps", str(steps)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--torch2", action="store_true")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    binary = os.path.join(args.build, "cpu_vs_torch")
    torch_peer = os.path.join(HERE, "cpu_peer_torch.py")

    runners = [("pipit", [binary])]
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                      capture_output=True).returncode == 0:
        runners.append(("PyTorch (Debian)", ["/usr/bin/python3", torch_peer]))
    else:
        print("Debian's python3-torch is not installed: its column is left out", flush=True)
    if args.torch2:
        runners.append(("PyTorch 2.x", [venv_python("torch2", ["torch", "numpy"]), torch_peer]))
    if not args.no_jax:
        runners.append(("JAX", [venv_python("jax", ["jax[cpu]"]),
                                os.path.join(HERE, "cpu_peer_jax.py")]))

    peak = json.loads(subprocess.run([binary, "--model", "peak"], check=True, capture_output=True,
                                     text=True).stdout)
    print(f"FP32 peak of one core ({peak['isa']} FMA loop): {peak['gflops']:.0f} GFLOP/s",
          flush=True)

    versions = {}
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for model in args.models.split(","):
            times = {name: [] for name, _ in runners}
            for _ in range(args.rounds):
                for name, argv in runners:
                    if threads > 1 and name in ONE_THREAD_ONLY:
                        continue
                    result = run_once(argv, model, threads)
                    times[name] += result["ms"]
                    if "version" in result:
                        versions[name] = result["version"]
            medians = {name: statistics.median(ms) for name, ms in times.items() if ms}
            rows.append((model, threads, medians))
            print(f"{model:8s} threads={threads}  " +
                  "  ".join(f"{name} {ms:9.3f}" for name, ms in medians.items()), flush=True)

    names = [name for name, _ in runners]
    peers = names[1:]

    def label(name):
        return f"{name} {versions[name]}" if name in versions else name

    def share_of_peak(ms, threads):
        return 100.0 * mlp_gemm_flops() / (ms / 1000.0) / (peak["gflops"] * 1e9 * threads)

    lines = [f"\n## cpu_vs_torch, {datetime.date.today()}, {cpu_name()}, {os.cpu_count()} cores\n",
             f"Median of {args.rounds} rounds, the frameworks in turns; FP32 peak of one core "
             f"{peak['gflops']:.0f} GFLOP/s ({peak['isa']} FMA loop); "
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}. "
             "Ratios are the peer's time over pipit's (> 1: pipit is faster); % of peak counts "
             "the MLP's GEMM FLOPs only.\n",
             "| model | threads | unit | " + " | ".join(label(n) for n in names) + " | " +
             " | ".join(f"{p}/pipit" for p in peers) + " | % of peak: " +
             " / ".join(names) + " |",
             "|" + " --- |" * (3 + len(names) + len(peers) + 1)]
    def cell(medians, name, value):
        return value(medians[name]) if name in medians else "-"

    for model, threads, medians in rows:
        p = medians["pipit"]
        peak_cell = (" / ".join(cell(medians, n, lambda ms: f"{share_of_peak(ms, threads):.0f}%")
                                for n in names) if model == "mlp" else "")
        lines.append(f"| {LABEL[model]} | {threads} | {UNIT[model]} | " +
                     " | ".join(cell(medians, n, lambda ms: f"{ms:.3f}") for n in names) + " | " +
                     " | ".join(cell(medians, n, lambda ms: f"{ms / p:.2f}") for n in peers) +
                     f" | {peak_cell} |")
    scaling = {m: None for m in ("mlp", "gpt")}
    by_key = {(m, t): med for m, t, med in rows}
    for m in scaling:
        if (m, 1) in by_key and (m, 2) in by_key:
            scaling[m] = by_key[(m, 1)]["pipit"] / by_key[(m, 2)]["pipit"]
    if all(v is not None for v in scaling.values()):
        lines.append(f"\npipit's speed-up from 1 to 2 threads: MLP {scaling['mlp']:.2f}x, "
                     f"GPT {scaling['gpt']:.2f}x.")
    publish("\n".join(lines) + "\n", not args.no_append)


if __name__ == "__main__":
    main()
