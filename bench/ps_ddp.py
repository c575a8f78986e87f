#!/usr/bin/env python3
"""PyTorch peer for the parameter-server benchmark: DistributedDataParallel, gloo, CPU.

Measures data-parallel training throughput of an MLP (Linear layers of widths --dims, ReLU
between them, none after the last; mean cross-entropy) with N worker processes on this machine,
each on its own synthetic batch (seeded by rank). Each step: zero_grad, forward, loss, backward
(DDP allreduces the gradients over gloo), optimizer step (sgd lr 0.01 or adamw lr 1e-3).
--warmup steps run untimed; then, after a barrier, rank 0 times --steps steps with
time.perf_counter.

bench/ps.cpp calls it as
    /usr/bin/python3 bench/ps_ddp.py --workers N --dims 784,1024,1024,10 --batch B --steps S
and parses the last line of stdout as JSON:
    {"framework": "torch-ddp-gloo", "torch": ..., "workers": N, "dims": [...], "batch": B,
     "steps": S, "threads": T, "seconds": ..., "samples_per_s": N*B*S/seconds, "ms_per_step": ...}
Everything else goes to stderr. Needs Debian's python3-torch (tools/install_deps.sh --with-torch);
a pyenv `python3` on PATH may not see it, hence /usr/bin/python3.
"""
import argparse
import json
import os
import socket
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--dims", default="784,1024,1024,10")
ap.add_argument("--batch", type=int, default=64, help="per-worker batch")
ap.add_argument("--steps", type=int, default=30, help="timed steps")
ap.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
ap.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
args = ap.parse_args()
args.dims = [int(d) for d in args.dims.split(",")]
assert len(args.dims) >= 2 and args.workers >= 1 and args.steps >= 1

# torch.set_num_threads does not reach the OpenBLAS pool that Debian's torch calls, so pin every
# pool through the environment before torch is imported (spawned workers inherit it).
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def make_mlp(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DDP(make_mlp(args.dims))
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(args.batch, args.dims[0], generator=gen)
    y = torch.randint(0, args.dims[-1], (args.batch,), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    loss.item()
    seconds = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        samples = args.workers * args.batch * args.steps
        print(json.dumps({
            "framework": "torch-ddp-gloo", "torch": torch.__version__,
            "workers": args.workers, "dims": args.dims, "batch": args.batch,
            "steps": args.steps, "threads": args.threads, "seconds": seconds,
            "samples_per_s": samples / seconds, "ms_per_step": 1000 * seconds / args.steps,
        }), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    # Keep stdout for the one JSON line: anything else torch prints goes to stderr.
    mp.spawn(worker, args=(args, free_port()), nprocs=args.workers, join=True)
