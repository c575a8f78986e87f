#!/usr/bin/env python3
"""Writes tests/data/tensorboard/scalars.tfevents: scalars logged by PyTorch's
torch.utils.tensorboard SummaryWriter (which writes through the tensorboard package), for
tests/tensorboard_test.cpp to compare pipit's own event writer with byte for byte; then reads
the file back with tensorboard's EventAccumulator, as tensorboard itself does.

Run in a venv outside the repository:
  ~/.cache/pipit-bench/torch2/bin/pip install torch tensorboard
  ~/.cache/pipit-bench/torch2/bin/python tests/make_tensorboard_reference.py [EVENT_FILE]

Given EVENT_FILE (one pipit wrote, e.g. train_gpt --tensorboard DIR's), reads that back with
EventAccumulator instead and prints its scalars.

The scalars (tag, value, step, wall time) are the ones the C++ test writes; the version event's
wall time is VERSION_TIME (time.time is fixed while the writer starts).
"""
import glob
import os
import shutil
import sys
import tempfile
import time

VERSION_TIME = 1764331200.25
SCALARS = [
    ("loss/train", 4.1743, 0, 1764331201.5),
    ("loss/train", 3.25, 1, 1764331202.0),
    ("loss/val", 3.5, 1, 1764331202.125),
    ("lr", 0.0, 2, 1764331203.0),
    ("tokens_per_s", 123456.78, 300, 1764331204.75),
    ("grad_norm", -0.5, 2**40, 1764331205.0),
]


def read_back(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(path)
    accumulator.Reload()
    for tag in accumulator.Tags()["scalars"]:
        for event in accumulator.Scalars(tag):
            print(f"{tag} step {event.step} value {event.value!r} wall_time {event.wall_time!r}")


def main():
    if len(sys.argv) > 1:
        read_back(sys.argv[1])
        return
    from torch.utils.tensorboard import SummaryWriter

    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "data", "tensorboard", "scalars.tfevents")
    with tempfile.TemporaryDirectory() as directory:
        real_time = time.time
        time.time = lambda: VERSION_TIME
        writer = SummaryWriter(directory)
        time.time = real_time
        for tag, value, step, wall_time in SCALARS:
            writer.add_scalar(tag, value, step, walltime=wall_time)
        writer.close()
        (written,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(written, out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    read_back(out)


if __name__ == "__main__":
    main()
