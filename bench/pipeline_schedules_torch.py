#!/usr/bin/env python3
"""torch.distributed.pipelining on the experiment of build/pipeline_schedules: side by side.

p = 4 ranks as 4 processes on this machine (gloo on 127.0.0.1), 8 layers that sleep instead
of computing (so stages do not compete for cores): forward F, input gradient I and weight
gradient W of --layer-ms each per layer, the two gradients separate autograd nodes so that
torch's zero-bubble schedules, which split each backward into an input pass and a weight
pass, pay each in its own task. As in pipit's benchmark the first stage starts with a free
layer (x * w), so every sleeping layer's input needs a gradient. Schedules: GPipe and 1F1B
(one stage of 2 layers per rank), interleaved 1F1B and interleaved zero bubble (2 stages of
1 layer per rank, round-robin), ZB-V (2 stages per rank in a V). Reports the median step
time of --steps steps after a warm-up step, efficiency against the schedule's theoretical
time (the formulas of pipit's README; for interleaved zero bubble, which pipit lacks, the ideal
m (F + B) with no bubble), and the overhead per task with layers that cost nothing.

Before torch it runs pipit's build/pipeline_schedules with the same layer time, and ends with
both side by side for the schedules they share: pipit's stages as 4 worker processes over TCP
against torch's 4 processes, and pipit's stages as threads for reference.

usage: <torch 2.x python> bench/pipeline_schedules_torch.py [--build build] [--layer-ms 4]
                                                            [--steps 3] [--no-append]
(PyTorch 2.x from PyPI with numpy, e.g. the environment bench/cpu_vs_torch.py --torch2 makes
under ~/.cache/pipit-bench/torch2; Debian's 1.13 has no torch.distributed.pipelining)
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

from bench_common import cpu_name, publish

P, LAYERS = 4, 8
HERE = os.path.dirname(os.path.abspath(__file__))
# name: (schedule class, chunks per rank, placement)
SCHEDULES = {
    "gpipe": (ScheduleGPipe, 1, "loop"),
    "1f1b": (Schedule1F1B, 1, "loop"),
    "interleaved": (ScheduleInterleaved1F1B, 2, "loop"),
    "interleaved zero bubble": (ScheduleInterleavedZeroBubble, 2, "loop"),
    "zbv": (ScheduleZBVZeroBubble, 2, "v"),
}


def fine_timer_slack():
    """A 1 ns timer slack for this process, as pipit's sleeping layers set for their threads
    (support/sleep_layer.h): with Linux's default 50 us every sleep would overshoot by up to
    that much, a cost pipit's side would not pay."""
    import ctypes
    PR_SET_TIMERSLACK = 29
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0)


def sleep(seconds):
    if seconds > 0:
        time.sleep(seconds)


class SleepThrough(torch.autograd.Function):
    """Identity that costs `forward` seconds forward and `backward` seconds backward."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        sleep(forward)
        ctx.backward = backward
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        sleep(ctx.backward)
        return grad, None, None


class SleepLayer(torch.nn.Module):
    """y = x * w: forward F; the input gradient I and the weight gradient W in their own
    autograd nodes, so a pass that needs only one pays only its cost."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        h = SleepThrough.apply(x, self.seconds, self.seconds)
        return h * SleepThrough.apply(self.w, 0.0, self.seconds)


class FreeLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w


def stage_indices(rank, chunks, placement):
    if chunks == 1:
        return [rank]
    return [rank, rank + P] if placement == "loop" else [rank, 2 * P - 1 - rank]


def build_stage(index, stages, seconds, example):
    layers = [SleepLayer(seconds) for _ in range(LAYERS // stages)]
    if index == 0:
        layers.insert(0, FreeLayer())
    return PipelineStage(torch.nn.Sequential(*layers), index, stages, torch.device("cpu"),
                         input_args=example)


def time_schedule(rank, name, m, seconds, steps):
    """Median step time in ms (on rank 0; None elsewhere)."""
    cls, chunks, placement = SCHEDULES[name]
    stages = P * chunks
    example = torch.zeros(1, 1)
    local = [build_stage(i, stages, seconds, example)
             for i in stage_indices(rank, chunks, placement)]
    loss = lambda output, target: (output - target).pow(2).sum()  # noqa: E731
    schedule = cls(local if chunks > 1 else local[0], m, loss_fn=loss)
    x, y = torch.zeros(m, 1), torch.zeros(m, 1)
    has_first = any(s.is_first for s in local)
    has_last = any(s.is_last for s in local)

    def step():
        kwargs = {}
        if has_last:
            kwargs["target"] = y
        if has_first:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)

    times = []
    for i in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        step()
        dist.barrier()
        if i > 0:
            times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times) if rank == 0 else None


def worker(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    fine_timer_slack()
    dist.init_process_group("gloo", rank=rank, world_size=P)
    seconds = args.layer_ms / 1000.0
    for name in SCHEDULES:
        for m in (8, 16, 32):
            ms = time_schedule(rank, name, m, seconds, args.steps)
            if rank == 0:
                results.put(("efficiency", name, m, ms))
    for name in SCHEDULES:
        ms = time_schedule(rank, name, 32, 0.0, args.steps)
        if rank == 0:
            results.put(("overhead", name, 32, ms))
    dist.destroy_process_group()


def theoretical_ms(name, m, f, b):
    """F, B per whole stage: pipit's README formulas; for torch's interleaved zero bubble, which
    pipit lacks, the ideal m (F + B)."""
    if name in ("gpipe", "1f1b"):
        return (m + P - 1) * (f + b)
    if name == "interleaved":
        return (m + (P - 1) / 2) * (f + b)
    if name == "zbv":
        return m * (f + b) + (P - 1) * f / 2
    return m * (f + b)


def critical_path_tasks(name, m):
    """Tasks on the critical path with unit cost per task, as pipit counts them: a stage's
    2m (F and B) or 3m (F, I, W) tasks per chunk plus the fill and drain."""
    chunks = SCHEDULES[name][1]
    per_stage = (3 if "zero" in name or name == "zbv" else 2) * m * chunks
    return per_stage + 2 * (P - 1)


def ms_and_efficiency(cell):
    """"268.5 (0.983)" -> (268.5, 0.983)."""
    ms, efficiency = cell.replace("(", " ").replace(")", " ").split()
    return float(ms), float(efficiency)


def pipit_rows(binary, layer_ms):
    """pipit's stages as 4 worker processes over TCP and as threads of one process, from the
    last table build/pipeline_schedules prints: {(schedule, m): (ms, efficiency)} and
    {schedule: us per task with zero-cost layers} for each."""
    out = subprocess.run([binary, "--no-append", "--layer-ms", str(layer_ms)], check=True,
                         capture_output=True, text=True).stdout
    pipit = {"processes": ({}, {}), "threads": ({}, {})}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # schedule | m | v | theory | threads ms (eff) | processes ms (eff) | threads us | processes us
        if len(cells) == 8 and cells[1].isdigit() and "(" in cells[4]:
            for where, ms_cell, us_cell in (("threads", 4, 6), ("processes", 5, 7)):
                pipit[where][0][(cells[0], int(cells[1]))] = ms_and_efficiency(cells[ms_cell])
                pipit[where][1][cells[0]] = float(cells[us_cell])
    return pipit


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--layer-ms", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    pipit = pipit_rows(os.path.join(args.build, "pipeline_schedules"), args.layer_ms)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    mp.start_processes(worker, args=(args, port, results), nprocs=P, start_method="spawn")
    rows = []
    while not results.empty():
        rows.append(results.get())

    f = 2 * args.layer_ms  # a whole stage of 2 layers
    b = 2 * f
    lines = [f"\n## pipeline_schedules_torch, {datetime.date.today()}, {cpu_name()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__}\n",
             f"torch.distributed.pipelining, gloo, {P} processes; {LAYERS} sleeping layers of "
             f"{args.layer_ms:g} ms forward, input gradient and weight gradient each (F = I = W "
             f"= {f:g} ms per stage of 2 layers), median of {args.steps} steps. Theory: pipit's "
             "formulas (README); m (F + B), no bubble, for interleaved zero bubble.\n",
             "| schedule | m | theoretical ms | measured ms | efficiency |",
             "| --- | --- | --- | --- | --- |"]
    for kind, name, m, ms in rows:
        if kind == "efficiency":
            theory = theoretical_ms(name, m, f, b)
            lines.append(f"| {name} | {m} | {theory:.1f} | {ms:.1f} | {theory / ms:.3f} |")
    lines += ["", "Overhead per task: the same with layers that cost nothing, m = 32, step time "
              "over the tasks on the critical path.\n",
              "| schedule | m | step us | tasks on critical path | us per task |",
              "| --- | --- | --- | --- | --- |"]
    for kind, name, m, ms in rows:
        if kind == "overhead":
            tasks = critical_path_tasks(name, m)
            lines.append(f"| {name} | {m} | {ms * 1000:.0f} | {tasks} | {ms * 1000 / tasks:.1f} |")
    torch_efficiency = {(name, m): (ms, theoretical_ms(name, m, f, b) / ms)
                        for kind, name, m, ms in rows if kind == "efficiency"}
    torch_overhead = {name: ms * 1000 / critical_path_tasks(name, m)
                      for kind, name, m, ms in rows if kind == "overhead"}
    lines += ["", "Side by side, the same run, both as 4 processes on this machine (pipit's "
              "stages as worker processes over TCP on loopback, torch's as gloo ranks): measured "
              "ms (efficiency against the schedule's theory) and us per task with zero-cost "
              "layers; pipit's stages as threads of one process last, for reference.\n",
              "| schedule | m | pipit processes ms (efficiency) | torch processes ms (efficiency) "
              "| pipit processes us/task | torch us/task | pipit threads ms (efficiency) | "
              "pipit threads us/task |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    nan = (float("nan"), float("nan"))
    for name in ("gpipe", "1f1b", "interleaved", "zbv"):
        for m in (8, 16, 32):
            pm, pe = pipit["processes"][0].get((name, m), nan)
            tm, te = torch_efficiency.get((name, m), nan)
            hm, he = pipit["threads"][0].get((name, m), nan)
            lines.append(f"| {name} | {m} | {pm:.1f} ({pe:.3f}) | {tm:.1f} ({te:.3f}) | "
                         f"{pipit['processes'][1].get(name, float('nan')):.1f} | "
                         f"{torch_overhead.get(name, float('nan')):.1f} | {hm:.1f} ({he:.3f}) | "
                         f"{pipit['threads'][1].get(name, float('nan')):.1f} |")
    publish("\n".join(lines) + "\n", not args.no_append)


if __name__ == "__main__":
    sys.exit(main())
