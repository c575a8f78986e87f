#!/usr/bin/env python3
"""The peer of bench/generate_speed.cpp: Hugging Face transformers' generate (KV cache on, SDPA
attention, greedy, on the CPU or --device cuda) on the same GPT-2 checkpoint and prompts, in f32 or
with the model in bf16 (--dtype bf16). Prints one JSON line per batch size: new tokens per second (best of --reps)
and an FNV-1a hash of the ids.
  python bench/generate_speed.py --make DIR [--layers 12 --width 768 --heads 12]   # a random GPT-2
  python bench/generate_speed.py --model DIR --batch 1 8 --new 256 [--reps 2] [--dtype bf16]
      [--device cuda]
"""
import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def prompts(batch, length, vocab):
    # The same ids as bench/generate_speed.cpp makes.
    return [[(b * 7919 + t * 104729 + 13) % vocab for t in range(length)] for b in range(batch)]


def fnv(rows):
    h = 0xCBF29CE484222325
    for row in rows:
        for i in row:
            h = ((h ^ i) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--make")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--model")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.make:
        torch.manual_seed(0)
        config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads)
        GPT2LMHeadModel(config).save_pretrained(args.make)
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = GPT2LMHeadModel.from_pretrained(args.model, dtype=dtype).eval().to(args.device)
    model.generation_config.eos_token_id = None  # every row runs --new tokens, as pipit's
    vocab = model.config.vocab_size
    for batch in args.batch:
        ids = torch.tensor(prompts(batch, args.prompt, vocab), device=args.device)
        best, out = float("inf"), None
        for _ in range(args.reps):
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=args.new, pad_token_id=0)
            if args.device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        new = out[:, args.prompt:].tolist()
        print(json.dumps({"tool": f"transformers {__import__('transformers').__version__}",
                          "batch": batch, "dtype": args.dtype, "tokens_per_s": batch * args.new / best,
                          "fnv": fnv(new), "threads": torch.get_num_threads(),
                          "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}), flush=True)


if __name__ == "__main__":
    main()
