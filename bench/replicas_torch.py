#!/usr/bin/env python3
"""PyTorch peer for build/replicas: torch.distributed.pipelining with DDP-wrapped stages.

p = 2 stages x r replicas as p * r processes on this machine (gloo on 127.0.0.1), laid out as
pipit lays them out: rank k * p + s is stage s of replica k. Each stage holds 4 sleeping
layers (bench/pipeline_schedules_torch.py's SleepLayer: --layer-ms forward, the input and the
weight gradient --layer-ms each, 1 ns timer slack as pipit's) and, with --ballast-mb, that
many MB of weights in 4 tensors that cost nothing to compute (x + 0 * sum(w)) but whose
gradients DDP all-reduces over the stage's replicas, in its buckets during the backward as
DDP users run it. 1F1B, m = 4 microbatches of 2 rows per replica, MSE loss, SGD lr 0. Rank 0
times --steps steps after a warm-up step, each between two barriers, and prints one JSON line:
    {"framework": "torch-pipelining-ddp-gloo", "torch": ..., "r": R, "ballast_mb": MB,
     "step_ms": median}

usage: <torch 2.x python> bench/replicas_torch.py --replicas R [--ballast-mb 16]
                                                  [--layer-ms 2] [--steps 5]
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_schedules_torch import SleepLayer, fine_timer_slack  # noqa: E402

P, M, ROWS = 2, 4, 2


class Ballast(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(size))

    def forward(self, x):
        return x + self.w.sum() * 0.0


def stage_module(seconds, ballast_mb):
    layers = []
    for _ in range(4):
        layers.append(SleepLayer(seconds))
        if ballast_mb > 0:
            layers.append(Ballast(int(ballast_mb * 1e6 / 16)))
    return torch.nn.Sequential(*layers)


def worker(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    fine_timer_slack()
    r = args.replicas
    dist.init_process_group("gloo", rank=rank, world_size=P * r)
    replica, stage = divmod(rank, P)
    # Every rank creates every group, in the same order, as torch.distributed requires.
    pipelines = [dist.new_group([k * P + s for s in range(P)]) for k in range(r)]
    replica_groups = [dist.new_group([k * P + s for k in range(r)]) for s in range(P)]
    module = stage_module(args.layer_ms / 1000.0, args.ballast_mb)
    if r > 1:
        module = DDP(module, process_group=replica_groups[stage])
    example = torch.zeros(ROWS, 1)
    pipeline_stage = PipelineStage(module, stage, P, torch.device("cpu"), input_args=example,
                                   group=pipelines[replica])
    loss = lambda output, target: (output - target).pow(2).sum()  # noqa: E731
    schedule = Schedule1F1B(pipeline_stage, M, loss_fn=loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
    x, y = torch.zeros(M * ROWS, 1), torch.zeros(M * ROWS, 1)
    times = []
    for i in range(args.steps + 1):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        if stage == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()
        dist.barrier()
        if i > 0:
            times.append((time.perf_counter() - start) * 1000.0)
    if rank == 0:
        results.put(statistics.median(times))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--ballast-mb", type=float, default=0.0)
    ap.add_argument("--layer-ms", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.spawn(worker, args=(args, port, results), nprocs=P * args.replicas, join=True)
    print(json.dumps({"framework": "torch-pipelining-ddp-gloo", "torch": torch.__version__,
                      "r": args.replicas, "ballast_mb": args.ballast_mb,
                      "step_ms": results.get()}))


if __name__ == "__main__":
    main()
