#!/usr/bin/env python3
"""GPT-2 small's memory-bound kernels on one GPU: pipit (build/gpu_kernels) vs PyTorch, as a
training step at batch 8, context 1024 runs them.

Kernel by kernel, runs pipit's binary and then torch in this process on the same shapes:
LayerNorm on the f32 residual stream [8192, 768] (F.layer_norm; both frameworks run it in
f32 under bf16 autocast), forward and forward + backward with the output's gradient given;
the mean cross-entropy of bf16 logits [8192, 50257] (F.cross_entropy under torch.autocast,
as the head's bf16 output reaches it), forward and forward + backward; one AdamW step over
GPT-2 small's parameters (untied head, 163M) with torch's `fused=True`, in the fwd+bwd
columns. Prints median milliseconds and torch's time over pipit's (> 1 means pipit is
faster) and appends the table to bench/RESULTS.md. Without a GPU it says so and exits 0.

usage: python3 bench/gpu_kernels.py [--build build] [--kernels layer_norm,cross_entropy,adamw]
           [--warmup 3] [--repeats 10] [--no-append]
"""
import statistics

import gpu_common

ROWS, WIDTH, VOCAB, LAYERS = 8 * 1024, 768, 50257, 12


def gpt2_shapes():
    """GPT-2 small's parameter shapes in gpu_kernels.cpp's order: embeddings, final LayerNorm,
    twelve blocks, the untied head."""
    shapes = [(VOCAB, WIDTH), (1024, WIDTH), (WIDTH,), (WIDTH,)]
    block = [(WIDTH,), (WIDTH,), (3 * WIDTH, WIDTH), (3 * WIDTH,), (WIDTH, WIDTH), (WIDTH,),
             (WIDTH,), (WIDTH,), (4 * WIDTH, WIDTH), (4 * WIDTH,), (WIDTH, 4 * WIDTH), (WIDTH,)]
    return shapes + block * LAYERS + [(VOCAB, WIDTH)]


def torch_kernel(torch, kernel, warmup, repeats):
    """Per-repeat ms of torch's forward and forward + backward (AdamW: None and its step)."""
    import torch.nn.functional as F
    from bench_common import time_steps

    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator)

    def timed(leaves, forward, grad):
        def run_forward():
            with torch.no_grad():
                forward()
            torch.cuda.synchronize()

        def run_step():
            for t in leaves:
                t.grad = None
            forward().backward(grad)
            torch.cuda.synchronize()
        return time_steps(warmup, repeats, run_forward), time_steps(warmup, repeats, run_step)

    if kernel == "layer_norm":
        x = randn(ROWS, WIDTH).requires_grad_()
        weight = torch.ones(WIDTH, device="cuda").requires_grad_()
        bias = torch.zeros(WIDTH, device="cuda").requires_grad_()
        return timed([x, weight, bias], lambda: F.layer_norm(x, (WIDTH,), weight, bias),
                     randn(ROWS, WIDTH))
    if kernel == "cross_entropy":
        logits = randn(ROWS, VOCAB).to(torch.bfloat16).requires_grad_()
        targets = (torch.arange(ROWS, device="cuda") * 7919) % VOCAB

        def forward():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy(logits, targets)
        return timed([logits], forward, None)
    params = []
    for shape in gpt2_shapes():
        p = (randn(*shape) * 0.02).requires_grad_()
        p.grad = randn(*shape) * 1e-3
        params.append(p)
    optimizer = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, fused=True)

    def step():
        optimizer.step()
        torch.cuda.synchronize()
    return None, time_steps(warmup, repeats, step)


def main():
    parser = gpu_common.parser(__doc__)
    parser.add_argument("--kernels", default="layer_norm,cross_entropy,adamw")
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_kernels.py", args.build)

    def ms(times):
        return statistics.median(times) if times else None

    def cells(mine, theirs):
        if mine is None or theirs is None:
            return "- | - | -"
        return f"{mine:.3f} | {theirs:.3f} | {theirs / mine:.2f}"

    table = ["| kernel | shape | pipit fwd ms | torch fwd ms | fwd torch/pipit | "
             "pipit fwd+bwd ms | torch fwd+bwd ms | fwd+bwd torch/pipit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kernel in args.kernels.split(","):
        row = gpu_common.run_case(binary, ["--kernels", kernel], args, [kernel], table)
        if row is None:
            continue
        forward, step = torch_kernel(torch, kernel, args.warmup, args.repeats)
        line = (f"| {kernel} | {row['shape']} | "
                f"{cells(ms(row.get('forward_ms')), ms(forward))} | "
                f"{cells(ms(row['step_ms']), ms(step))} |")
        print(line, flush=True)
        table.append(line)
        torch.cuda.empty_cache()
    gpu_common.finish("gpu_kernels (LayerNorm, cross-entropy, AdamW)", torch, table, args)


if __name__ == "__main__":
    main()
