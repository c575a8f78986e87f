#!/usr/bin/env python3
"""GEMM throughput on one GPU: pipit (build/gpu_gemm) vs torch.matmul, same shapes and dtypes.

Row by row, runs pipit's binary and then the same GEMMs in PyTorch in this process, takes the
median time of each, prints TFLOP/s and the ratio pipit/torch (> 1 means pipit is faster),
and appends the table to bench/RESULTS.md. Without a GPU it says so and exits 0.

dtypes: f32 (full f32), tf32 (f32 tensors, TF32 tensor cores: set_float32_matmul_precision
"high" on both sides), bf16 (bf16 in and out), bf16-f32 (bf16 in, f32 out, as pipit's
autocast multiplies; torch.mm(..., out_dtype=float32) where this torch has it).

usage: python3 bench/gpu_gemm.py [--build build] [--dtypes ...] [--sizes ...] [--no-append]
"""
import statistics

import gpu_common


def torch_gemm(torch, kind, n, iters, warmup, repeats):
    """Milliseconds per GEMM for each timed repeat, or None where torch has no such GEMM."""
    from bench_common import time_steps

    torch.set_float32_matmul_precision("high" if kind == "tf32" else "highest")
    dtype = torch.bfloat16 if kind.startswith("bf16") else torch.float32
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=generator).to(dtype)
    b = torch.randn(n, n, device="cuda", generator=generator).to(dtype)
    if kind == "bf16-f32":
        out = torch.empty(n, n, device="cuda", dtype=torch.float32)
        try:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
        except (TypeError, RuntimeError):
            return None
        gemm = lambda: torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        gemm = lambda: torch.matmul(a, b, out=out)

    def run():
        for _ in range(iters):
            gemm()
        torch.cuda.synchronize()
    return [ms / iters for ms in time_steps(warmup, repeats, run)]


def tflops(n, ms):
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def main():
    parser = gpu_common.parser(__doc__)
    parser.add_argument("--dtypes", default="f32,tf32,bf16,bf16-f32")
    parser.add_argument("--sizes", default="1024,2048,4096,8192")
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_gemm.py", args.build)

    table = ["| dtype | size | pipit TFLOP/s | torch TFLOP/s | pipit/torch |",
             "| --- | --- | --- | --- | --- |"]
    for kind in args.dtypes.split(","):
        for size in args.sizes.split(","):
            row = gpu_common.run_case(binary, ["--dtypes", kind, "--sizes", size], args,
                                      [kind, size], table)
            if row is None:
                continue
            n = row["size"]
            pipit = tflops(n, statistics.median(row["ms"]))
            torch_ms = torch_gemm(torch, kind, n, row["iters"], args.warmup, args.repeats)
            if torch_ms is None:
                line = f"| {kind} | {n} | {pipit:.1f} | - | - |"
            else:
                theirs = tflops(n, statistics.median(torch_ms))
                line = f"| {kind} | {n} | {pipit:.1f} | {theirs:.1f} | {pipit / theirs:.2f} |"
            table.append(line)
            print(line, flush=True)
    gpu_common.finish("gpu_gemm", torch, table, args)


if __name__ == "__main__":
    main()
