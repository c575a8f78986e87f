#!/usr/bin/env python3
"""GPT training step on one GPU: pipit (build/gpu_gpt2) vs PyTorch, same model.

The model is GPT-2 small by default (12 layers, 12 heads, width 768, context 1024, vocab
50257, batch 8, dropout 0), as pipit's gpt() builds it: pre-LN blocks, tanh GELU, learned
position embedding, untied head (--tied: GPT-2's head, the token embedding's table without a
bias, as llm.c trains it, on both sides); AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1),
random tokens. Modes: f32, tf32 (set_float32_matmul_precision "high") and bf16 (autocast).
--vocab-multiple pads the vocabulary on both sides, as llm.c pads 50257 to 50304 and nanoGPT
trains with 50304: pipit masks the padded logits out of its loss; the peer, as nanoGPT, takes
them into the softmax (targets stay below --vocab).

The peer is PyTorch as its users run it: attention through F.scaled_dot_product_attention
(flash or memory-efficient kernels) and AdamW(fused=True). pipit runs its fused attention
kernel. --compile adds the same model under torch.compile; --written-out adds torch eager with
attention written out (matmul, mask, softmax), the peer of earlier tables. MFU counts
6 N + 6 L C T FLOPs per token as llm.c does, N without the token embedding (it multiplies
nothing; the untied head is counted instead; tied, the one table counts once), against the GPU's dense bf16 peak (--peak-tflops,
default from the GPU's name).

--llmc PATH adds karpathy/llm.c's train_gpt2cu (a build the user brings; bench/llmc_peer.py)
at the same batch and context, bf16 only: llm.c ties its head and pads its vocabulary to 50304,
so compare it with --tied --vocab-multiple 64.

--cuda-graph times pipit's steps as replays of one captured CUDA graph of the forward and
backward (cuda::Graph) plus AdamW's eager step; without it pipit launches every kernel. Its
peer is --compile --compile-mode reduce-overhead (torch.compile replaying CUDA graphs).

--weight-gradient-parts 2 or 4 splits pipit's weight gradients whose outputs have fewer tiles
than the GPU has SMs (tensor/cuda/weight_gradient_split.h; the peer's are its own).

Mode by mode, runs pipit's binary and then PyTorch in this process, prints the median ms/step,
tokens/s, the ratio torch/pipit (> 1 means pipit is faster), peak memory and the last loss (a
sanity check only: the two initialise differently), and appends the table to bench/RESULTS.md.
--profile adds pipit's per-op table (cuda::OpTimer) and torch.profiler's for one step of each
mode. Without a GPU it says so and exits 0.

usage: python3 bench/gpu_gpt2.py [--build build] [--modes f32,tf32,bf16] [--layers 12]
           [--heads 12] [--width 768] [--context 1024] [--vocab 50257] [--vocab-multiple 1]
           [--batch 8] [--tied] [--weight-gradient-parts 1]
           [--warmup 3] [--steps 10] [--profile] [--top 25] [--compile] [--written-out]
           [--compile-mode default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs]
           [--attention automatic|pipit|cudnn] [--cuda-graph] [--peak-tflops X] [--llmc PATH]
           [--no-append]
"""
import argparse
import os
import statistics

import gpu_common
import llmc_peer

INT_FLAGS = [("layers", 12), ("heads", 12), ("width", 768), ("context", 1024),
             ("vocab", 50257), ("vocab-multiple", 1), ("batch", 8), ("warmup", 3), ("steps", 10),
             ("top", 25), ("weight-gradient-parts", 1)]


# Dense bf16 tensor-core peaks (TFLOP/s) by GPU name, from NVIDIA's data sheets (SXM parts).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def pipit_arguments(args):
    """build/gpu_gpt2's flags for the run `args` describes (its mode chosen by the caller)."""
    passed = [arg for name, _ in INT_FLAGS
              for arg in (f"--{name}", str(getattr(args, name.replace("-", "_"))))]
    passed += ["--attention", args.attention]
    for switch in ("profile", "tied", "cuda_graph"):
        if getattr(args, switch):
            passed.append("--" + switch.replace("_", "-"))
    return passed


def flops_per_token(args, parameters):
    """6 N + 6 L C T, N without the token embedding (see the docstring)."""
    matmul_parameters = parameters - (0 if args.tied else args.vocab * args.width)
    return 6 * matmul_parameters + 6 * args.layers * args.width * args.context


def mfu_text(flops_per_second, peak_tflops):
    return f"{flops_per_second / (peak_tflops * 1e12) * 100:.1f}%" if peak_tflops else "-"


def torch_run(torch, mode, args, compiled=False, attention="sdpa", profile=False):
    """Per-step ms, peak bytes and last loss of PyTorch's run of `mode` (under torch.compile
    where `compiled`: its compilation falls in the warm-up steps); with `profile`, then one
    more step under torch.profiler, whose table it prints."""
    import torch.nn.functional as F
    # The CPU comparison's model, written to match pipit's gpt(), and its timing loop.
    from bench_common import time_steps
    from cpu_peer_torch import Gpt, adamw

    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    # With --vocab-multiple the peer's vocabulary is padded too, as nanoGPT's 50304 is.
    multiple = args.vocab_multiple
    vocab = (args.vocab + multiple - 1) // multiple * multiple
    model = Gpt(vocab, args.context, args.layers, args.heads, args.width, attention,
                tied=args.tied).cuda()
    if compiled:
        # A fresh compile for this shape, as a user's program compiles it: without the reset
        # dynamo would recompile an earlier run's model with the batch as a symbolic size.
        torch._dynamo.reset()
    forward = torch.compile(model, mode=args.compile_mode) if compiled else model
    # reduce-overhead replays CUDA graphs, whose outputs the next replay overwrites.
    graphs = compiled and args.compile_mode in ("reduce-overhead", "max-autotune")
    opt = adamw(list(model.parameters()), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                weight_decay=0.1)
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randint(0, args.vocab, (args.batch, args.context), device="cuda",
                          generator=generator) for _ in range(2))
    losses = []

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = F.cross_entropy(forward(x).view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        losses.append(loss.detach().clone() if graphs else loss.detach())

    times = time_steps(args.warmup, args.steps, step)
    peak = torch.cuda.max_memory_allocated()

    if profile:
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


def profile_torch(mode, options):
    """torch's step of `mode` under torch.profiler, run in a child process: torch's CUPTI
    teardown can free activity buffers CUPTI still writes to and abort the process that
    profiled at exit with "double free or corruption" (fixed in pytorch/pytorch#195207), which
    took the whole benchmark down after its tables."""
    import torch
    args = argparse.Namespace(**options)
    args.warmup, args.steps = 1, 1
    torch_run(torch, mode, args, profile=True)


def run_profile_child(mode, args):
    import multiprocessing
    child = multiprocessing.get_context("spawn").Process(target=profile_torch,
                                                         args=(mode, vars(args)))
    child.start()
    child.join()
    if child.exitcode != 0:
        print(f"torch.profiler's process for {mode} exited with {child.exitcode} after "
              "profiling (its table above, if printed, is complete)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(gpu_common.HERE, "..", "build"))
    parser.add_argument("--modes", default="f32,tf32,bf16")
    for name, default in INT_FLAGS:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tied", action="store_true",
                        help="GPT-2's tied head on both sides (the token embedding's table)")
    parser.add_argument("--compile", action="store_true",
                        help="also time PyTorch under torch.compile (with SDPA)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune",
                                 "max-autotune-no-cudagraphs"),
                        help="torch.compile's mode (reduce-overhead: CUDA graphs, the peer of "
                             "pipit's --cuda-graph)")
    parser.add_argument("--written-out", action="store_true",
                        help="also time PyTorch eager with attention written out")
    parser.add_argument("--attention", default="automatic",
                        choices=("automatic", "pipit", "cudnn"),
                        help="pipit's bf16 attention provider")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="pipit's forward and backward replayed as one CUDA graph")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense bf16 peak for the MFU column")
    parser.add_argument("--llmc", default=None,
                        help="karpathy/llm.c's train_gpt2cu, timed beside pipit in bf16")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_gpt2.py", args.build)
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)

    passed = pipit_arguments(args)
    gib = 1024.0 ** 3
    table = ["| mode | pipit ms/step | pipit tokens/s | pipit MFU | torch SDPA ms/step | "
             "torch/pipit | torch.compile SDPA ms/step | compiled/pipit | "
             "torch written-out ms/step | llm.c ms/step | llm.c/pipit | pipit peak GiB | "
             "torch peak GiB (eager / compiled) | last loss pipit / torch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    row = None
    for mode in args.modes.split(","):
        rows = gpu_common.run_pipit(binary, ["--modes", mode] + passed)
        if not rows:
            table.append(f"| {mode} | failed | | | | | | | | | | | | |")
            continue
        [row] = rows
        pipit_ms = statistics.median(row["ms"])
        tokens = row["tokens"]
        mfu = mfu_text(flops_per_token(args, row["parameters"]) * tokens / (pipit_ms * 1e-3),
                       peak)
        times, torch_peak, loss = torch_run(torch, mode, args)
        torch.cuda.empty_cache()  # the next pipit run needs the memory torch keeps cached
        if args.profile:
            run_profile_child(mode, args)
        torch_ms = statistics.median(times)
        compiled = "- | -"
        peaks = f"{torch_peak / gib:.1f}"
        if args.compile:
            compiled_times, compiled_peak, _ = torch_run(torch, mode, args, compiled=True)
            compiled_ms = statistics.median(compiled_times)
            torch.cuda.empty_cache()
            compiled = f"{compiled_ms:.1f} | {compiled_ms / pipit_ms:.2f}"
            peaks = f"{torch_peak / gib:.1f} / {compiled_peak / gib:.1f}"
        written = "-"
        if args.written_out:
            written_ms = statistics.median(torch_run(torch, mode, args, attention="written")[0])
            torch.cuda.empty_cache()
            written = f"{written_ms:.1f}"
        llmc = "- | -"
        if args.llmc and mode == "bf16":
            llmc_ms = llmc_peer.median_ms(args.llmc, args)
            if llmc_ms:
                llmc = f"{llmc_ms:.1f} | {llmc_ms / pipit_ms:.2f}"
        line = (f"| {mode} | {pipit_ms:.1f} | {tokens / pipit_ms * 1e3:.0f} | {mfu} | "
                f"{torch_ms:.1f} | {torch_ms / pipit_ms:.2f} | {compiled} | {written} | {llmc} | "
                f"{row['peak_bytes'] / gib:.1f} | {peaks} | "
                f"{row['loss']:.3f} / {loss:.3f} |")
        table.append(line)
        print(line, flush=True)
    if row is None:
        return
    config = (f"{args.layers} layers, {args.heads} heads, width {args.width}, context "
              f"{args.context}, vocab {args.vocab} (padded to a multiple of "
              f"{args.vocab_multiple}), {'tied' if args.tied else 'untied'} head, batch "
              f"{args.batch}, {row['parameters']} parameters; MFU against {peak} TFLOP/s; "
              f"pipit's attention {args.attention}, weight gradients in "
              f"{args.weight_gradient_parts} part(s)"
              f"{', pipit replaying a CUDA graph' if args.cuda_graph else ''}"
              f"{'' if args.compile_mode == 'default' else ', torch.compile mode ' + args.compile_mode}")
    print(f"\n{config}\n\n" + "\n".join(table))
    if not args.no_append:
        gpu_common.append_results(f"gpu_gpt2 ({config})", torch, table)


if __name__ == "__main__":
    main()
