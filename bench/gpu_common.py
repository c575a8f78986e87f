"""What the GPU benchmark scripts share: their common flags, the device check, running pipit's
binary, and printing a table and appending it, dated, to bench/RESULTS.md."""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cuda_device_count():
    """Devices the driver reports, asked of libcuda itself: neither PyTorch nor pipit's build
    is needed to tell that a machine has no GPU."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def require_gpu(program, build):
    """Exits 0 with a message where there is no GPU; exits 1 where there is one but pipit's
    binary or PyTorch with CUDA is missing. Returns (binary path, torch)."""
    if cuda_device_count() == 0:
        print(f"{program}: needs a CUDA device; none found")
        sys.exit(0)
    binary = os.path.join(build, program.removesuffix(".py"))
    if not os.path.exists(binary):
        sys.exit(f"{program}: {binary} not found: build pipit with CUDA (nvcc on PATH or "
                 "-DPIPIT_CUDA=ON) and pass --build DIR")
    try:
        import torch
    except ImportError as e:
        sys.exit(f"{program}: needs PyTorch with CUDA for the comparison ({e})")
    if not torch.cuda.is_available():
        sys.exit(f"{program}: PyTorch {torch.__version__} sees no CUDA device "
                 "(a CPU-only build?)")
    return binary, torch


def run_pipit(binary, args):
    """Runs pipit's binary; returns its JSON lines and prints everything else it says. Where
    the binary fails, prints what it said and returns None."""
    run = subprocess.run([binary] + args, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"{os.path.basename(binary)} {' '.join(args)} failed (exit {run.returncode}):\n"
              f"{run.stdout}{run.stderr}", flush=True)
        return None
    rows = []
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        else:
            print(line)
    return rows


def run_case(binary, arguments, args, cells, table):
    """Runs pipit's binary on one case with the script's --warmup and --repeats; returns its one
    JSON row, or None after adding to `table` a row that says the case `cells` names failed."""
    rows = run_pipit(binary, arguments + ["--warmup", str(args.warmup), "--repeats",
                                          str(args.repeats)])
    if not rows:
        columns = table[1].count("---")
        table.append("| " + " | ".join(cells) + " | failed |" + " |" * (columns - len(cells) - 1))
        return None
    [row] = rows
    return row


def parser(doc):
    """An argument parser with the flags every per-kernel script takes (--build, --warmup,
    --repeats, --no-append); the script adds its own."""
    flags = argparse.ArgumentParser(description=doc.splitlines()[0])
    flags.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    flags.add_argument("--warmup", type=int, default=3)
    flags.add_argument("--repeats", type=int, default=10)
    flags.add_argument("--no-append", action="store_true")
    return flags


def finish(title, torch, table, args):
    """Prints the finished table and appends it to bench/RESULTS.md unless --no-append."""
    print("\n" + "\n".join(table))
    if not args.no_append:
        append_results(title, torch, table)


def append_results(title, torch, table):
    """Appends `table` (markdown lines) under a dated heading naming the GPU and torch."""
    heading = (f"\n## {title}, {datetime.date.today()}, {torch.cuda.get_device_name(0)}, "
               f"torch {torch.__version__}, CUDA {torch.version.cuda}\n\n")
    with open(os.path.join(HERE, "RESULTS.md"), "a") as f:
        f.write(heading + "\n".join(table) + "\n")


def forward_and_step_row(cells, forward_flops, step_flops, pipit_row, torch_forward_ms,
                         torch_step_ms):
    """A table row: `cells` (what the row is), then TFLOP/s of pipit's and torch's forward and
    forward + backward from median times, each pair with pipit/torch. Printed as it goes."""
    def tflops(flops, times):
        return flops / (statistics.median(times) * 1e-3) / 1e12
    mine_f = tflops(forward_flops, pipit_row["forward_ms"])
    mine_s = tflops(step_flops, pipit_row["step_ms"])
    theirs_f = tflops(forward_flops, torch_forward_ms)
    theirs_s = tflops(step_flops, torch_step_ms)
    line = ("| " + " | ".join(cells) + f" | {mine_f:.1f} | {theirs_f:.1f} | "
            f"{mine_f / theirs_f:.2f} | {mine_s:.1f} | {theirs_s:.1f} | {mine_s / theirs_s:.2f} |")
    print(line, flush=True)
    return line
