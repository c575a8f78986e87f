#!/usr/bin/env python3
"""GPT training step on one GPU: pipit (build/gpu_gpt2) vs PyTorch eager, same model.

The model is GPT-2 small by default (12 layers, 12 heads, width 768, context 1024, vocab
50257, batch 8, dropout 0), as pipit's gpt() builds it: pre-LN blocks, tanh GELU, learned
position embedding, untied head, attention written out (no fused kernel) on both sides;
AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1), random tokens. Modes: f32, tf32
(set_float32_matmul_precision "high") and bf16 (autocast). Mode by mode, runs pipit's binary
and then PyTorch in this process, prints the median ms/step, tokens/s, the ratio torch/pipit
(> 1 means pipit is faster), peak memory and the last loss (a sanity check only: the two
initialise differently), and appends the table to bench/RESULTS.md. --profile adds pipit's per-op table (cuda::OpTimer) and torch.profiler's
for one step of each mode. Without a GPU it says so and exits 0.

usage: python3 bench/gpu_gpt2.py [--build build] [--modes f32,tf32,bf16] [--layers 12]
           [--heads 12] [--width 768] [--context 1024] [--vocab 50257] [--batch 8]
           [--warmup 3] [--steps 10] [--profile] [--top 25] [--compile] [--no-append]
"""
import argparse
import os
import statistics

import gpu_common

INT_FLAGS = [("layers", 12), ("heads", 12), ("width", 768), ("context", 1024),
               ("vocab", 50257), ("batch", 8), ("warmup", 3), ("steps", 10), ("top", 25)]


def torch_run(torch, mode, args, compiled=False):
    """Per-step ms, peak bytes and last loss of PyTorch's run of `mode` (under torch.compile
    where `compiled`: its compilation falls in the warm-up steps)."""
    import torch.nn.functional as F
    # The CPU comparison's model, written to match pipit's gpt(), and its timing loop.
    from bench_common import time_steps
    from cpu_peer_torch import Gpt

    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    model = Gpt(args.vocab, args.context, args.layers, args.heads, args.width).cuda()
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randint(0, args.vocab, (args.batch, args.context), device="cuda",
                          generator=generator) for _ in range(2))
    losses = []

    def step():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = F.cross_entropy(forward(x).view(-1, args.vocab), y.view(-1))
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        losses.append(loss.detach())

    times = time_steps(args.warmup, args.steps, step)
    peak = torch.cuda.max_memory_allocated()

    if args.profile and not compiled:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
        averages = prof.key_averages()
        try:
            table = averages.table(sort_by="device_time_total", row_limit=args.top)
        except (AttributeError, KeyError):  # torch before 2.4 names it after CUDA
            table = averages.table(sort_by="cuda_time_total", row_limit=args.top)
        print(f"\ntorch, {mode}, one step under torch.profiler\n\n{table}")
    return times, peak, losses[-1].item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(gpu_common.HERE, "..", "build"))
    parser.add_argument("--modes", default="f32,tf32,bf16")
    for name, default in INT_FLAGS:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help="also time PyTorch under torch.compile")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_gpt2.py", args.build)

    passed = [arg for name, _ in INT_FLAGS for arg in (f"--{name}", str(getattr(args, name)))]
    if args.profile:
        passed.append("--profile")
    gib = 1024.0 ** 3
    table = ["| mode | pipit ms/step | torch ms/step | pipit tokens/s | torch tokens/s | "
             "torch/pipit | pipit peak GiB | torch peak GiB | last loss pipit / torch | "
             "torch.compile ms/step | compiled/pipit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in args.modes.split(","):
        rows = gpu_common.run_pipit(binary, ["--modes", mode] + passed)
        if not rows:
            table.append(f"| {mode} | failed | | | | | | | | | |")
            continue
        [row] = rows
        pipit_ms = statistics.median(row["ms"])
        times, peak, loss = torch_run(torch, mode, args)
        torch.cuda.empty_cache()  # the next pipit run needs the memory torch keeps cached
        torch_ms = statistics.median(times)
        tokens = row["tokens"]
        compiled = "| - | - |"
        if args.compile:
            compiled_ms = statistics.median(torch_run(torch, mode, args, compiled=True)[0])
            torch.cuda.empty_cache()
            compiled = f"| {compiled_ms:.1f} | {compiled_ms / pipit_ms:.2f} |"
        line = (f"| {mode} | {pipit_ms:.1f} | {torch_ms:.1f} | {tokens / pipit_ms * 1e3:.0f} | "
                f"{tokens / torch_ms * 1e3:.0f} | {torch_ms / pipit_ms:.2f} | "
                f"{row['peak_bytes'] / gib:.1f} | {peak / gib:.1f} | "
                f"{row['loss']:.3f} / {loss:.3f} {compiled}")
        table.append(line)
        print(line, flush=True)
    config = (f"{args.layers} layers, {args.heads} heads, width {args.width}, context "
              f"{args.context}, vocab {args.vocab}, batch {args.batch}, {row['parameters']} "
              "parameters")
    print(f"\n{config}\n\n" + "\n".join(table))
    if not args.no_append:
        gpu_common.append_results(f"gpu_gpt2 ({config})", torch, table)


if __name__ == "__main__":
    main()
