#!/usr/bin/env python3
"""Linear layers on one GPU: pipit's `linear` (bias in cuBLASLt's epilogues, build/gpu_linear)
vs PyTorch's F.linear, forward and forward + backward, as a training step runs them.

Row by row, runs pipit's binary and then torch in this process on the same shapes: an f32
input that requires grad, f32 weight [N, K] and bias [N], the output's gradient given; bf16
runs under autocast on both sides (torch.autocast, pipit's AutocastGuard), tf32 with TF32
matmuls allowed on both. The default shapes are GPT-2 small's Linears at batch 8, context
1024 (the head padded to 50304). TFLOP/s count 2 M K N for the forward and 6 M K N for both.
Prints pipit/torch (> 1 means pipit is faster) and appends the table to bench/RESULTS.md.
Without a GPU it says so and exits 0.

usage: python3 bench/gpu_linear.py [--build build] [--modes bf16,tf32,f32]
           [--shapes 8192x768x2304,...] [--warmup 3] [--repeats 10] [--no-append]
"""
import contextlib

import gpu_common

DEFAULT_SHAPES = "8192x768x2304,8192x768x768,8192x768x3072,8192x3072x768,8192x768x50304"


def torch_linear(torch, mode, M, K, N, warmup, repeats):
    """Per-repeat ms of torch's forward, and of forward + backward."""
    import torch.nn.functional as F
    from bench_common import time_steps

    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=generator).requires_grad_()
    weight = (torch.randn(N, K, device="cuda", generator=generator) * 0.02).requires_grad_()
    bias = torch.zeros(N, device="cuda").requires_grad_()
    out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    grad = torch.randn(M, N, device="cuda", generator=generator).to(out_dtype)

    def autocast():
        if mode == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run_forward():
        with torch.no_grad(), autocast():
            F.linear(x, weight, bias)
        torch.cuda.synchronize()

    def run_step():
        for t in (x, weight, bias):
            t.grad = None
        with autocast():
            out = F.linear(x, weight, bias)
        out.backward(grad)
        torch.cuda.synchronize()
    try:
        return time_steps(warmup, repeats, run_forward), time_steps(warmup, repeats, run_step)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def main():
    parser = gpu_common.parser(__doc__)
    parser.add_argument("--modes", default="bf16,tf32,f32")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_linear.py", args.build)

    table = ["| mode | M x K x N | pipit fwd TFLOP/s | torch fwd TFLOP/s | fwd pipit/torch | "
             "pipit fwd+bwd TFLOP/s | torch fwd+bwd TFLOP/s | fwd+bwd pipit/torch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in args.modes.split(","):
        for shape in args.shapes.split(","):
            row = gpu_common.run_case(binary, ["--modes", mode, "--shapes", shape], args,
                                      [mode, shape], table)
            if row is None:
                continue
            M, K, N = row["m"], row["k"], row["n"]
            forward_flops = 2.0 * M * K * N
            fwd, step = torch_linear(torch, mode, M, K, N, args.warmup, args.repeats)
            table.append(gpu_common.forward_and_step_row([mode, shape], forward_flops,
                                                         3 * forward_flops, row, fwd, step))
            torch.cuda.empty_cache()
    gpu_common.finish("gpu_linear (forward, forward + backward)", torch, table, args)


if __name__ == "__main__":
    main()
