#!/usr/bin/env python3
"""PyTorch's side of bench/cpu_vs_torch.py: the same models, data and optimizers as
bench/cpu_vs_torch.cpp, in eager mode. Runs under any PyTorch: Debian's python3-torch, or
PyTorch 2.x from PyPI in the virtual environment cpu_vs_torch.py makes with --torch2.

usage: python cpu_peer_torch.py --model M --threads T --warmup W --steps S; prints one JSON line
{"ms": [per-step times], "version": torch.__version__}.
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_common import peer_flags, time_chained_adds, time_steps


# Attention as torch's users run it: F.scaled_dot_product_attention (fused kernels: flash or
# memory-efficient on GPUs) from torch 2.0 on; written out (matmul, mask, softmax) before that,
# or where a benchmark asks for it as a labelled extra.
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, width, heads, attention="sdpa"):
        super().__init__()
        self.heads = heads
        self.sdpa = attention == "sdpa" and HAS_SDPA
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
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(C // self.heads)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width, attention="sdpa", tied=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads, attention) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        # tied: GPT-2's head, the token embedding's table without a bias (as pipit's --tied).
        self.head = nn.Linear(width, vocab, bias=not tied)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(pos))))


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


def adamw(params, **options):
    """torch's fastest AdamW here: fused (one kernel for all parameters) where this torch has it
    for the parameters' device, else its default (foreach)."""
    try:
        return torch.optim.AdamW(params, fused=True, **options)
    except (TypeError, RuntimeError):
        return torch.optim.AdamW(params, **options)


def torch_gpt(warmup, steps):
    torch.manual_seed(0)
    model = Gpt(65, 128, 4, 4, 128)
    opt = adamw(list(model.parameters()), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
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
    return time_chained_adds(warmup, steps, torch.add, torch.tensor([1.0]), torch.tensor([2.0]))


def torch_bf16_ops(warmup, steps):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 1024, generator=g).to(torch.bfloat16)
    b = torch.randn(4096, 1024, generator=g).to(torch.bfloat16)

    def step():
        torch.add(a, b), torch.mul(a, b), F.gelu(a, approximate="tanh")
    return time_steps(warmup, steps, step)


TORCH = {"mlp": torch_mlp, "gpt": torch_gpt, "tiny_op": torch_tiny_op,
         "bf16_ops": torch_bf16_ops}


if __name__ == "__main__":
    flags = peer_flags(__doc__.splitlines()[0])
    torch.set_num_threads(flags.threads)
    print(json.dumps({"ms": TORCH[flags.model](flags.warmup, flags.steps),
                      "version": torch.__version__}))
