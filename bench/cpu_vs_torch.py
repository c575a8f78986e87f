#!/usr/bin/env python3
"""pipit vs PyTorch on the CPU: same models, shapes, optimizer and thread count.

Alternates pipit (build/cpu_vs_torch) and PyTorch (Debian's python3-torch) round by round in
one run, takes the median step time of each, prints ms/step and the ratio PyTorch/pipit
(> 1 means pipit is faster), and appends a dated table to bench/RESULTS.md.

usage: /usr/bin/python3 bench/cpu_vs_torch.py [--build build] [--rounds 3] [--no-append]
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# torch.set_num_threads does not reach the BLAS that Debian's torch calls (OpenBLAS, with its
# own thread pool), so each thread count runs in a child process whose environment pins every
# pool to that count before torch is imported.
if "--child" in sys.argv:
    _threads = sys.argv[sys.argv.index("--threads") + 1]
    assert _threads.isdigit(), "a child runs one thread count"
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _threads

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = {"mlp": (3, 10), "gpt": (2, 6), "tiny_op": (1, 5)}  # (warm-up, timed) per round


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // self.heads)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(pos))))


def time_steps(warmup, steps, step):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def torch_mlp(warmup, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(256, 784)
    y = torch.arange(256) % 10

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return time_steps(warmup, steps, step)


def torch_gpt(warmup, steps):
    torch.manual_seed(0)
    model = Gpt(65, 128, 4, 4, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.01)
    i = torch.arange(16 * 128)
    x = ((i * 7) % 65).view(16, 128)
    y = ((i * 7 + 3) % 65).view(16, 128)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x).view(-1, 65), y.view(-1)).backward()
        opt.step()
    return time_steps(warmup, steps, step)


def torch_tiny_op(warmup, steps):
    a, b = torch.tensor([1.0]), torch.tensor([2.0])
    ops = 10000

    def step():
        nonlocal a
        for _ in range(ops):
            a = torch.add(a, b)
    return [t * 1000.0 / ops for t in time_steps(warmup, steps, step)]


TORCH = {"mlp": torch_mlp, "gpt": torch_gpt, "tiny_op": torch_tiny_op}


def pipit_times(binary, model, threads, warmup, steps):
    out = subprocess.run([binary, model, str(threads), str(warmup), str(steps)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms"]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(here, "..", "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    binary = os.path.join(args.build, "cpu_vs_torch")

    if args.child:
        threads = int(args.threads)
        torch.set_num_threads(threads)
        for model in ["mlp", "gpt", "tiny_op"]:
            warmup, steps = STEPS[model]
            pipit_ms, torch_ms = [], []
            for _ in range(args.rounds):
                pipit_ms += pipit_times(binary, model, threads, warmup, steps)
                torch_ms += TORCH[model](warmup, steps)
            p, t = statistics.median(pipit_ms), statistics.median(torch_ms)
            print(json.dumps({"model": model, "threads": threads, "pipit": p, "torch": t}),
                  flush=True)
        return

    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--threads",
                                str(threads), "--build", args.build, "--rounds",
                                str(args.rounds)], check=True, capture_output=True, text=True)
        for line in child.stdout.splitlines():
            r = json.loads(line)
            p, t = r["pipit"], r["torch"]
            rows.append((r["model"], threads, p, t, t / p))
            print(f"{r['model']:8s} threads={threads}  pipit {p:9.3f}  torch {t:9.3f}  "
                  f"torch/pipit {t / p:5.2f}", flush=True)

    unit = {"mlp": "ms/step", "gpt": "ms/step", "tiny_op": "us/op"}
    lines = [f"\n## cpu_vs_torch, {datetime.date.today()}, {cpu_name()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__}\n",
             "| model | threads | unit | pipit | PyTorch | PyTorch/pipit |",
             "| --- | --- | --- | --- | --- | --- |"]
    for model, threads, p, t, ratio in rows:
        lines.append(f"| {model} | {threads} | {unit[model]} | {p:.3f} | {t:.3f} | {ratio:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_append:
        with open(os.path.join(here, "RESULTS.md"), "a") as f:
            f.write(table)


if __name__ == "__main__":
    main()
