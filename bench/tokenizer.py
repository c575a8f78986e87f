#!/usr/bin/env python3
"""The peers of bench/tokenizer.cpp: encode speed of Hugging Face tokenizers and tiktoken
(when installed) on the same text with the same byte-level BPE, single-threaded. Prints one
JSON line per tool: MB/s with a fresh tokenizer (cold cache) and on a second encode of the same
text (warm), the token count and an FNV-1a hash of the ids, for the C++ side to compare.
  python bench/tokenizer.py --text FILE --tokenizer DIR [--reps 5]
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def fnv(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        h = ((h ^ i) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def measure(name, make, text, reps):
    size = len(text.encode("utf-8"))
    cold, warm, ids = [], [], None
    for _ in range(reps):
        enc = make()
        start = time.perf_counter()
        ids = enc(text)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        enc(text)
        warm.append(time.perf_counter() - start)
    print(json.dumps({"tool": name, "cold_mbs": size / 1e6 / min(cold),
                      "warm_mbs": size / 1e6 / min(warm), "tokens": len(ids), "fnv": fnv(ids)}),
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    vocab_path = os.path.join(args.tokenizer, "vocab.json")
    merges_path = os.path.join(args.tokenizer, "merges.txt")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    def hf():
        tok = Tokenizer(models.BPE.from_file(vocab_path, merges_path))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|endoftext|>"])
        return lambda s: tok.encode(s).ids

    measure("tokenizers", hf, text, args.reps)

    # As HF is mostly fed: a batch of lines (on one thread here). Cutting at lines changes how
    # whitespace runs split, so these ids are not comparable to the whole text's.
    lines = text.splitlines(keepends=True)

    def hf_lines():
        tok = Tokenizer(models.BPE.from_file(vocab_path, merges_path))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.add_special_tokens(["<|endoftext|>"])
        return lambda s: [i for e in tok.encode_batch(lines) for i in e.ids]

    measure("tokenizers, batch of lines", hf_lines, text, args.reps)

    try:
        import tiktoken
    except ImportError:
        return
    # tiktoken ranks byte strings; with one new token per merge, a token's id orders it as its
    # merge does, so the ids are the ranks.
    chars = {}  # GPT-2's byte-to-unicode map, inverted
    n = 256
    for b in range(256):
        printable = 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255
        chars[chr(b) if printable else chr(n)] = b
        if not printable:
            n += 1
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    special = {"<|endoftext|>": vocab.pop("<|endoftext|>")}
    ranks = {bytes(chars[c] for c in token): i for token, i in vocab.items()}
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def tt():
        enc = tiktoken.Encoding("pipit-bench", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=special)
        return lambda s: enc.encode(s, allowed_special="all")

    measure("tiktoken", tt, text, args.reps)


if __name__ == "__main__":
    main()
