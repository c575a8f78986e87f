#!/usr/bin/env python3
"""Writes tests/data/torch_reference.json: inputs, weights, outputs and gradients computed by
PyTorch for the layers tests/torch_reference_test.cpp checks pipit against.

Run with Debian's python3-torch: /usr/bin/python3 tests/make_torch_reference.py
Each case stores tensors as {"shape": [...], "values": [...]} (float32 values)."""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def t(x):
    return {"shape": list(x.shape), "values": [float(v) for v in x.detach().reshape(-1).tolist()]}


def backward_with(out, seed):
    gen = torch.Generator().manual_seed(seed)
    upstream = torch.randn(out.shape, generator=gen)
    (out * upstream).sum().backward()
    return upstream


cases = {}

# Linear on a 3-D input.
x = torch.randn(2, 3, 4, requires_grad=True)
lin = torch.nn.Linear(4, 5)
out = lin(x)
up = backward_with(out, 1)
cases["linear"] = {"x": t(x), "weight": t(lin.weight), "bias": t(lin.bias), "upstream": t(up),
                   "out": t(out), "grad_x": t(x.grad), "grad_weight": t(lin.weight.grad),
                   "grad_bias": t(lin.bias.grad)}

# LayerNorm with non-trivial affine parameters.
x = torch.randn(2, 3, 6, requires_grad=True)
ln = torch.nn.LayerNorm(6)
with torch.no_grad():
    ln.weight.copy_(torch.randn(6))
    ln.bias.copy_(torch.randn(6))
out = ln(x)
up = backward_with(out, 2)
cases["layer_norm"] = {"x": t(x), "weight": t(ln.weight), "bias": t(ln.bias), "upstream": t(up),
                       "out": t(out), "grad_x": t(x.grad), "grad_weight": t(ln.weight.grad),
                       "grad_bias": t(ln.bias.grad)}

# GELU, tanh approximation (GPT-2).
x = (torch.randn(3, 7) * 2).requires_grad_()
out = F.gelu(x, approximate="tanh")
up = backward_with(out, 3)
cases["gelu"] = {"x": t(x), "upstream": t(up), "out": t(out), "grad_x": t(x.grad)}

# Softmax + cross-entropy on [B, T, C] logits with an ignored target.
logits = (torch.randn(2, 3, 7) * 3).requires_grad_()
targets = torch.tensor([[1, 6, -100], [0, 3, 5]])
loss = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), ignore_index=-100)
loss.backward()
probs = torch.softmax(logits.detach(), -1)
cases["cross_entropy"] = {"logits": t(logits), "targets": targets.reshape(-1).tolist(),
                          "target_shape": list(targets.shape), "loss": float(loss),
                          "softmax": t(probs), "grad_logits": t(logits.grad)}

# Causal self-attention laid out as pipit's: qkv Linear (C -> 3C, q | k | v, heads contiguous
# within each), scaled dot product, causal mask, softmax, proj Linear (C -> C).
B, T, C, H = 2, 5, 8, 2
x = torch.randn(B, T, C, requires_grad=True)
qkv = torch.nn.Linear(C, 3 * C)
proj = torch.nn.Linear(C, C)
q, k, v = qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
out = proj((att @ v).transpose(1, 2).reshape(B, T, C))
up = backward_with(out, 4)
cases["attention"] = {"width": C, "heads": H, "x": t(x), "qkv.weight": t(qkv.weight),
                      "qkv.bias": t(qkv.bias), "proj.weight": t(proj.weight),
                      "proj.bias": t(proj.bias), "upstream": t(up), "out": t(out),
                      "grad_x": t(x.grad), "grad_qkv.weight": t(qkv.weight.grad),
                      "grad_qkv.bias": t(qkv.bias.grad), "grad_proj.weight": t(proj.weight.grad),
                      "grad_proj.bias": t(proj.bias.grad)}

# Two AdamW steps (the second exercises bias correction past step 1).
p = torch.randn(3, 4, requires_grad=True)
start = p.detach().clone()
grads = [torch.randn(3, 4), torch.randn(3, 4)]
opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
after = []
for g in grads:
    p.grad = g.clone()
    opt.step()
    after.append(t(p))
cases["adamw"] = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1,
                  "param": t(start), "grads": [t(g) for g in grads], "after": after}

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_reference.json")
with open(path, "w") as f:
    json.dump({"torch_version": torch.__version__, "cases": cases}, f, indent=1)
print("wrote", path)
