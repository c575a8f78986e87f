#!/usr/bin/env python3
"""JAX's side of bench/cpu_vs_torch.py: the same models, data and optimizer rules as
bench/cpu_vs_torch.cpp, each training step one function under jax.jit (XLA), on the CPU.

usage: python cpu_peer_jax.py --model M --threads T --warmup W --steps S   (run by cpu_vs_torch.py in the
virtual environment it makes); prints one JSON line {"ms": [per-step times]}.
"""
import json
import math

import jax
import jax.numpy as jnp

from bench_common import peer_flags, time_chained_adds, time_steps

jax.config.update("jax_platforms", "cpu")


def time_train_steps(loss_fn, update, params, opt_state, warmup, steps):
    """Times steps of one jitted function: loss and gradients, then the optimizer's update."""
    @jax.jit
    def train_step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = update(params, opt_state, grads)
        return params, opt_state, loss

    state = [params, opt_state]

    def step():
        state[0], state[1], loss = train_step(state[0], state[1])
        loss.block_until_ready()
    return time_steps(warmup, steps, step)


def linear_init(key, fan_in, fan_out):
    bound = 1.0 / math.sqrt(fan_in)
    kw, kb = jax.random.split(key)
    return {"w": jax.random.uniform(kw, (fan_out, fan_in), jnp.float32, -bound, bound),
            "b": jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound)}


def linear(p, x):
    return x @ p["w"].T + p["b"]


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def sgd_momentum(lr, momentum):
    """torch.optim.SGD's rule: buf = momentum * buf + grad; p -= lr * buf."""
    def update(params, bufs, grads):
        bufs = jax.tree_util.tree_map(lambda b, g: momentum * b + g, bufs, grads)
        params = jax.tree_util.tree_map(lambda p, b: p - lr * b, params, bufs)
        return params, bufs
    return update


def adamw(lr, b1, b2, eps, wd):
    """torch.optim.AdamW's rule, with bias correction."""
    def update(params, state, grads):
        m, v, t = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def step(p, m_, v_):
            p = p * (1 - lr * wd)
            return p - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + eps)
        return jax.tree_util.tree_map(step, params, m, v), (m, v, t)
    return update


def jax_mlp(warmup, steps):
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    sizes = [784, 1024, 1024, 10]
    params = [linear_init(keys[i], sizes[i], sizes[i + 1]) for i in range(3)]
    bufs = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = jax.random.normal(keys[3], (256, 784), jnp.float32)
    y = jnp.arange(256) % 10
    update = sgd_momentum(0.01, 0.9)

    def loss_fn(params):
        h = x
        for i, p in enumerate(params):
            h = linear(p, h)
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return cross_entropy(h, y)

    return time_train_steps(loss_fn, update, params, bufs, warmup, steps)


def layer_norm_init(width):
    return {"g": jnp.ones((width,), jnp.float32), "b": jnp.zeros((width,), jnp.float32)}


def layer_norm(p, x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]


def gpt_init(key, vocab, context, layers, width):
    keys = iter(jax.random.split(key, 3 + 4 * layers))
    blocks = []
    for _ in range(layers):
        blocks.append({"ln1": layer_norm_init(width),
                       "qkv": linear_init(next(keys), width, 3 * width),
                       "proj": linear_init(next(keys), width, width),
                       "ln2": layer_norm_init(width),
                       "fc": linear_init(next(keys), width, 4 * width),
                       "fc_proj": linear_init(next(keys), 4 * width, width)})
    return {"wte": 0.02 * jax.random.normal(next(keys), (vocab, width), jnp.float32),
            "wpe": 0.02 * jax.random.normal(next(keys), (context, width), jnp.float32),
            "blocks": blocks, "ln": layer_norm_init(width),
            "head": linear_init(next(keys), width, vocab)}


# Attention as JAX's users run it: jax.nn.dot_product_attention (JAX 0.4.31 on), which XLA
# lowers to its fused implementation where it has one; written out before that.
HAS_DOT_PRODUCT_ATTENTION = hasattr(jax.nn, "dot_product_attention")


def gpt_forward(params, idx, heads):
    B, T = idx.shape
    x = params["wte"][idx] + params["wpe"][:T]
    C = x.shape[-1]
    mask = jnp.triu(jnp.ones((T, T), bool), 1)
    for p in params["blocks"]:
        qkv = linear(p["qkv"], layer_norm(p["ln1"], x)).reshape(B, T, 3, heads, C // heads)
        if HAS_DOT_PRODUCT_ATTENTION:
            # [B, T, heads, D] in and out, as the function takes them.
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, T, C)
        else:
            q, k, v = jnp.transpose(qkv, (2, 0, 3, 1, 4))
            att = (q @ jnp.swapaxes(k, -1, -2)) / math.sqrt(C // heads)
            att = jax.nn.softmax(jnp.where(mask, -jnp.inf, att), axis=-1)
            y = jnp.transpose(att @ v, (0, 2, 1, 3)).reshape(B, T, C)
        x = x + linear(p["proj"], y)
        h = jax.nn.gelu(linear(p["fc"], layer_norm(p["ln2"], x)), approximate=True)
        x = x + linear(p["fc_proj"], h)
    return linear(params["head"], layer_norm(params["ln"], x))


def jax_gpt(warmup, steps):
    vocab, context, layers, heads, width = 65, 128, 4, 4, 128
    params = gpt_init(jax.random.PRNGKey(0), vocab, context, layers, width)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    opt_state = (zeros, zeros, 0)
    i = jnp.arange(16 * 128)
    x = ((i * 7) % vocab).reshape(16, 128)
    y = ((i * 7 + 3) % vocab).reshape(-1)
    update = adamw(3e-4, 0.9, 0.95, 1e-8, 0.01)

    def loss_fn(params):
        return cross_entropy(gpt_forward(params, x, heads).reshape(-1, vocab), y)

    return time_train_steps(loss_fn, update, params, opt_state, warmup, steps)


def jax_tiny_op(warmup, steps):
    return time_chained_adds(warmup, steps, jnp.add, jnp.array([1.0]), jnp.array([2.0]),
                             lambda a: a.block_until_ready())


def jax_bf16_ops(warmup, steps):
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (4096, 1024)).astype(jnp.bfloat16)
    b = jax.random.normal(key_b, (4096, 1024)).astype(jnp.bfloat16)
    ops = jax.jit(lambda a, b: (a + b, a * b, jax.nn.gelu(a, approximate=True)))

    def step():
        jax.block_until_ready(ops(a, b))
    return time_steps(warmup, steps, step)


MODELS = {"mlp": jax_mlp, "gpt": jax_gpt, "tiny_op": jax_tiny_op, "bf16_ops": jax_bf16_ops}

if __name__ == "__main__":
    flags = peer_flags(__doc__.splitlines()[0])
    print(json.dumps({"ms": MODELS[flags.model](flags.warmup, flags.steps)}))
