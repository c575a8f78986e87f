#!/usr/bin/env python3
"""Causal attention on one GPU: pipit's fused kernels and, where the build has it, cuDNN's
fused attention through pipit (build/gpu_attention --provider) vs PyTorch's
F.scaled_dot_product_attention (flash attention where it applies), same shapes and dtypes.

Row by row, runs pipit's binary and then torch in this process: q, k, v as [B, H, T, D] views
of one packed [B, T, 3, H, D] tensor, forward alone and forward + backward, median times.
TFLOP/s count a causal forward as 2 B H T^2 D (half of the 4 B H T^2 D of full attention) and
the backward as 2.5 times the forward, as FlashAttention's papers do. Prints pipit/torch (> 1
means pipit is faster) and appends the table to bench/RESULTS.md. Without a GPU it says so and
exits 0.

usage: python3 bench/gpu_attention.py [--build build] [--dtypes bf16,f16,f32]
           [--shapes 8x12x1024x64,2x12x4096x64] [--providers pipit,cudnn] [--warmup 3]
           [--repeats 10] [--no-append]
"""

import gpu_common


def torch_attention(torch, dtype_name, B, H, T, D, warmup, repeats):
    """Per-repeat ms of torch's forward, and of forward + backward."""
    import torch.nn.functional as F
    from bench_common import time_steps

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype_name]
    generator = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randn(B, T, 3, H, D, device="cuda", generator=generator).to(dtype)
    packed.requires_grad_()
    grad = torch.randn(B, H, T, D, device="cuda", generator=generator).to(dtype)

    def forward():
        q, k, v = packed.permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def run_forward():
        with torch.no_grad():
            forward()
        torch.cuda.synchronize()

    def run_step():
        packed.grad = None
        forward().backward(grad)
        torch.cuda.synchronize()
    return time_steps(warmup, repeats, run_forward), time_steps(warmup, repeats, run_step)


def main():
    parser = gpu_common.parser(__doc__)
    parser.add_argument("--dtypes", default="bf16,f16,f32")
    parser.add_argument("--shapes", default="8x12x1024x64,2x12x4096x64")
    parser.add_argument("--providers", default="pipit,cudnn",
                        help="pipit's attention providers to time (cudnn: bf16/f16 only)")
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_attention.py", args.build)

    table = ["| dtype | provider | B x H x T x D | pipit fwd TFLOP/s | torch fwd TFLOP/s | "
             "fwd pipit/torch | pipit fwd+bwd TFLOP/s | torch fwd+bwd TFLOP/s | "
             "fwd+bwd pipit/torch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cases = [(d, p, s) for d in args.dtypes.split(",") for p in args.providers.split(",")
             for s in args.shapes.split(",") if not (p == "cudnn" and d == "f32")]
    for dtype, provider, shape in cases:
        row = gpu_common.run_case(binary, ["--dtypes", dtype, "--shapes", shape, "--provider",
                                           provider], args, [dtype, provider, shape], table)
        if row is None:
            continue
        B, H, T, D = row["batch"], row["heads"], row["context"], row["head_dim"]
        forward_flops = 2.0 * B * H * T * T * D
        fwd, step = torch_attention(torch, dtype, B, H, T, D, args.warmup, args.repeats)
        table.append(gpu_common.forward_and_step_row([dtype, provider, shape], forward_flops,
                                                     3.5 * forward_flops, row, fwd, step))
        torch.cuda.empty_cache()
    gpu_common.finish("gpu_attention (causal)", torch, table, args)


if __name__ == "__main__":
    main()
