#!/usr/bin/env python3
"""GPT-2 small's training step on one GPU at several batches, every peer in one run: one table.

The model and step are bench/gpu_gpt2.py's with GPT-2's tied head and the vocabulary padded to
50304 (llm.c's and nanoGPT's shape), context 1024. For each mode (bf16 autocast, tf32) and
batch, in this order: pipit launching every kernel, pipit replaying its forward and backward as
one CUDA graph (--cuda-graph), PyTorch eager with SDPA and fused AdamW, torch.compile in each
of --compile-modes (reduce-overhead is its CUDA graphs), and llm.c's train_gpt2cu (--llmc,
bf16 only). A row is printed as soon as its peer has run, so a run cut short still leaves its
rows; the whole table goes to bench/RESULTS.md at the end.

Columns: median ms/step, tokens/s, MFU (6 N + 6 L C T FLOPs per token, as gpu_gpt2.py counts
them, over the GPU's dense bf16 peak, whatever the mode), peak memory (pipit's and torch's
peaks of allocated bytes; llm.c's is the device memory in use it reports, CUDA context and
workspaces included), and the row's ms over the faster pipit's at that mode and batch (> 1:
pipit is faster).

--prewarm compiles each torch.compile run once and times nothing: run it beside work that
does not time the GPU, and the sweep after it finds inductor's caches full (the peer's compile
time is never in its steps either way; this only shortens the run).

usage: python3 bench/gpu_gpt2_sweep.py [--build build] [--batches 8,16,32] [--modes bf16,tf32]
           [--compile-modes default,reduce-overhead] [--llmc PATH] [--warmup 3] [--steps 10]
           [--peak-tflops X] [--no-append] [--prewarm]
"""
import argparse
import os
import statistics

import gpu_common
import gpu_gpt2
import llmc_peer

GIB = 1024.0 ** 3


def model_args(batch, options):
    """The namespace gpu_gpt2's helpers read, for GPT-2 small at `batch`."""
    values = {name.replace("-", "_"): default for name, default in gpu_gpt2.INT_FLAGS}
    values.update(batch=batch, vocab_multiple=64, warmup=options.warmup, steps=options.steps,
                  tied=True, attention="automatic", profile=False, cuda_graph=False,
                  compile_mode="default")
    return argparse.Namespace(**values)


def pipit_peer(binary, mode, args, cuda_graph):
    args.cuda_graph = cuda_graph
    rows = gpu_common.run_pipit(binary, ["--modes", mode] + gpu_gpt2.pipit_arguments(args))
    if not rows:
        return None
    [row] = rows
    return row["ms"], f"{row['peak_bytes'] / GIB:.1f}", row["parameters"]


def torch_peer(torch, mode, args, compile_mode):
    args.compile_mode = compile_mode or "default"
    try:
        times, peak, _ = gpu_gpt2.torch_run(torch, mode, args, compiled=compile_mode is not None)
    except Exception as e:  # a peer that fails leaves its row, not the rest of the table
        print(f"torch ({compile_mode or 'eager'}, {mode}, batch {args.batch}) failed: {e}",
              flush=True)
        return None
    finally:
        torch.cuda.empty_cache()  # the next peer needs the memory torch keeps cached
    return times, f"{peak / GIB:.1f}", None


def llmc(binary, args):
    result = llmc_peer.run(binary, args)
    if not result:
        return None
    times, device_mib = result
    return times, f"{device_mib / 1024:.1f} (device)" if device_mib else "-", None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(gpu_common.HERE, "..", "build"))
    parser.add_argument("--batches", default="8,16,32")
    parser.add_argument("--modes", default="bf16,tf32")
    parser.add_argument("--compile-modes", default="default,reduce-overhead")
    parser.add_argument("--llmc", default=None, help="karpathy/llm.c's train_gpt2cu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--prewarm", action="store_true",
                        help="only compile each torch.compile run once, filling inductor's "
                             "caches, so that a later sweep spends its time on steps")
    options = parser.parse_args()
    binary, torch = gpu_common.require_gpu("gpu_gpt2.py", options.build)
    name = torch.cuda.get_device_name(0)
    peak = options.peak_tflops or next(
        (v for k, v in gpu_gpt2.PEAK_TFLOPS.items() if k in name), None)
    compile_modes = [m for m in options.compile_modes.split(",") if m]

    table = ["| mode | batch | peer | ms/step | tokens/s | MFU | peak GiB | ms / pipit's best |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in options.modes.split(","):
        for batch in (int(b) for b in options.batches.split(",")):
            args = model_args(batch, options)
            if options.prewarm:
                args.warmup, args.steps = 1, 1
                for m in compile_modes:
                    print(f"prewarm {mode} batch {batch} {m}: "
                          f"{'done' if torch_peer(torch, mode, args, m) else 'failed'}", flush=True)
                continue
            tokens = batch * args.context
            peers = [("pipit", lambda: pipit_peer(binary, mode, args, False)),
                     ("pipit --cuda-graph", lambda: pipit_peer(binary, mode, args, True)),
                     ("torch eager", lambda: torch_peer(torch, mode, args, None))]
            peers += [(f"torch.compile {m}", lambda m=m: torch_peer(torch, mode, args, m))
                      for m in compile_modes]
            if options.llmc and mode == "bf16":
                peers.append(("llm.c", lambda: llmc(options.llmc, args)))
            parameters, pipit_best = None, None
            for peer, run in peers:
                result = run()
                if result is None:
                    table.append(f"| {mode} | {batch} | {peer} | failed | | | | |")
                    print(table[-1], flush=True)
                    continue
                times, peak_text, counted = result
                parameters = parameters or counted
                ms = statistics.median(times)
                if peer.startswith("pipit"):
                    pipit_best = min(ms, pipit_best or ms)
                mfu = (gpu_gpt2.mfu_text(gpu_gpt2.flops_per_token(args, parameters) * tokens /
                                         (ms * 1e-3), peak) if parameters else "-")
                ratio = f"{ms / pipit_best:.2f}" if pipit_best else "-"
                table.append(f"| {mode} | {batch} | {peer} | {ms:.1f} | {tokens / ms * 1e3:.0f} "
                             f"| {mfu} | {peak_text} | {ratio} |")
                print(table[-1], flush=True)
    if options.prewarm:
        return
    config = ("GPT-2 small sweep (12 layers, 12 heads, width 768, context 1024, vocab 50257 "
              f"padded to 50304, tied head; MFU against {peak} TFLOP/s; median of "
              f"{options.steps} steps after {options.warmup})")
    print(f"\n{config}\n\n" + "\n".join(table))
    if not options.no_append:
        gpu_common.append_results(config, torch, table)


if __name__ == "__main__":
    main()
