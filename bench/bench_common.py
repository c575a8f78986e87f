"""What the Python benchmarks share: naming the CPU in a results heading, timing steps,
publishing a results table, and the flags of bench/cpu_vs_torch's peers."""
import argparse
import os
import platform
import time


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def publish(table, append):
    """Prints a finished results table and, when `append`, adds it to bench/RESULTS.md."""
    print(table)
    if append:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"), "a") as f:
            f.write(table)


def time_steps(warmup, steps, step):
    """Milliseconds of each of `steps` calls of `step` after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def time_chained_adds(warmup, steps, add, a, b, finish=lambda a: None, ops=10000):
    """Microseconds per call of `add` over steps of `ops` chained calls (each adds `b` to the
    one before's result), `finish` waiting for the last: a framework's cost per tiny op."""
    def step():
        nonlocal a
        for _ in range(ops):
            a = add(a, b)
        finish(a)
    return [t * 1000.0 / ops for t in time_steps(warmup, steps, step)]


def peer_flags(description):
    """The flags bench/cpu_vs_torch.py gives pipit (build/cpu_vs_torch) and each of its peers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    return parser.parse_args()
