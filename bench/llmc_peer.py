"""karpathy/llm.c's train_gpt2cu as a peer of bench/gpu_gpt2.py (--llmc PATH).

The binary is the user's own build of llm.c (no part of it is in this repository). It trains
the GPT-2 shape its descriptor names (`-e d12` is GPT-2 small: random initialisation, head
tied to the token embedding, vocabulary padded to 50304, bf16 activations with f32 master
weights, attention through cuDNN where it was built with cuDNN) on random tokens written in
its data format, at the batch and context of pipit's run. llm.c times each step between two
CUDA events around its whole training step; its first step is the warm-up it names itself.
"""
import array
import os
import random
import re
import statistics
import subprocess
import tempfile

# llm.c's model descriptors: depth -> (width, heads) (train_gpt2.cu's gpt_build_from_descriptor).
DESCRIPTORS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
GPT2_VOCAB = 50257
MAX_CONTEXT = 1024
# llm.c's token files (llmc/dataloader.h): 256 int32s (magic, version, token count, zeros),
# then the tokens as uint16.
HEADER_INTS, MAGIC, VERSION = 256, 20240520, 1
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|")
# What the device held after llm.c allocated everything (cudaMemGetInfo: its CUDA context and
# cuDNN's workspace included, so larger than a framework's own peak of allocated bytes).
MEMORY_LINE = re.compile(r"^device memory usage: (\d+) MiB")


def unsupported(args):
    """Why llm.c cannot train the shape `args` asks for, or None."""
    if DESCRIPTORS.get(args.layers) != (args.width, args.heads):
        return (f"llm.c builds GPT-2's shapes only (depth: width, heads = {DESCRIPTORS}); "
                f"asked {args.layers} layers of width {args.width}, {args.heads} heads")
    if args.vocab != GPT2_VOCAB or args.context > MAX_CONTEXT:
        return f"llm.c trains vocab {GPT2_VOCAB}, context <= {MAX_CONTEXT}"
    return None


def write_tokens(path, count, seed):
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1], header[2] = MAGIC, VERSION, count
    rng = random.Random(seed)
    tokens = array.array("H", (rng.randrange(GPT2_VOCAB) for _ in range(count)))
    with open(path, "wb") as f:
        header.tofile(f)
        tokens.tofile(f)


def run(binary, args, timeout_s=600):
    """(per-step ms of llm.c's steps after args.warmup (at least its own warm-up step), the
    device MiB it reported in use), or None with what it said printed where it fails or cannot
    train the shape."""
    reason = unsupported(args)
    if reason:
        print(f"llm.c: skipped: {reason}", flush=True)
        return None
    warmup = max(1, args.warmup)
    tokens_per_step = args.batch * args.context + 1
    with tempfile.TemporaryDirectory() as folder:
        train, val = os.path.join(folder, "train.bin"), os.path.join(folder, "val.bin")
        write_tokens(train, 4 * tokens_per_step, seed=0)
        write_tokens(val, tokens_per_step, seed=1)
        # -r 0: no recomputation in the backward (llm.c's README trains GPT-2 small so); one
        # validation batch at step 0, none after, no sampling, no HellaSwag, no checkpoints.
        command = [binary, "-i", train, "-j", val, "-e", f"d{args.layers}",
                   "-b", str(args.batch), "-t", str(args.context), "-r", "0",
                   "-x", str(warmup + args.steps), "-v", str(10 ** 9), "-m", "1", "-s", "0",
                   "-h", "0", "-n", "0"]
        try:
            finished = subprocess.run(command, cwd=folder, capture_output=True, text=True,
                                      timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"llm.c: timed out after {timeout_s} s", flush=True)
            return None
    times, device_mib = [], None
    for line in finished.stdout.splitlines():
        match = STEP_LINE.match(line)
        if match and int(match.group(1)) > warmup:
            times.append(float(match.group(2)))
        memory = MEMORY_LINE.match(line)
        if memory:
            device_mib = int(memory.group(1))
    if finished.returncode != 0 or len(times) != args.steps:
        print(f"llm.c: {' '.join(command)} exited {finished.returncode} with {len(times)} "
              f"timed steps:\n{finished.stdout[-4000:]}{finished.stderr[-4000:]}", flush=True)
        return None
    return times, device_mib


def median_ms(binary, args):
    result = run(binary, args)
    return statistics.median(result[0]) if result else None
