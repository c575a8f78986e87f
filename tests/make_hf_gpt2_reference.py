#!/usr/bin/env python3
"""Writes tests/data/hf_gpt2/: small random GPT-2 checkpoints as Hugging Face `transformers`
saves them, with their logits and greedy generations, for tests/hf_gpt2_test.cpp to check
pipit against without Python; then, given a built train_gpt, checks the other direction: a
checkpoint pipit saves loads in `transformers` with the same logits.

Run in a venv outside the repository (offline: the models are built, not downloaded):
  python3 -m venv ~/.cache/pipit-bench/torch2
  ~/.cache/pipit-bench/torch2/bin/pip install torch transformers safetensors
  ~/.cache/pipit-bench/torch2/bin/python tests/make_hf_gpt2_reference.py [build/train_gpt]

Writes:
  tied/      GPT2LMHeadModel, 2 layers, width 64, 4 heads, vocab 512, context 64, lm_head tied
             to wte (save_pretrained: config.json, model.safetensors)
  sharded/   the same model saved in shards (model.safetensors.index.json + shards)
  untied/    1 layer, width 32, 2 heads, vocab 128, tie_word_embeddings false
  no_embd_dropout/
             2 layers, width 32, 2 heads, vocab 96, embd_pdrop 0 (pipit's blocks then start
             at layer 1, with no Dropout before them)
  reference.safetensors
             tokens [2, 16] and each model's logits for them ("tied_logits", "untied_logits",
             "no_embd_dropout_logits"),
             and greedy generations of the tied model: "prompt_N" and "greedy_N" (20 new
             tokens or up to the end-of-text token 511, do_sample=False, each prompt alone)
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "hf_gpt2")
NEW_TOKENS = 20


def make_model(seed, **config):
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**config)).eval()
    # GPT-2's init leaves biases at 0 and norms at 1: move every parameter so a weight read
    # into the wrong place (or left out, or not transposed) shows in the logits.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits.float().contiguous()


def main():
    os.makedirs(OUT, exist_ok=True)
    tied = make_model(0, vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                      bos_token_id=511, eos_token_id=511)
    untied = make_model(1, vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=127, eos_token_id=127)
    no_embd_dropout = make_model(3, vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                 n_head=2, embd_pdrop=0.0, bos_token_id=95, eos_token_id=95)
    tied.save_pretrained(os.path.join(OUT, "tied"))
    tied.save_pretrained(os.path.join(OUT, "sharded"), max_shard_size="200KB")
    untied.save_pretrained(os.path.join(OUT, "untied"))
    no_embd_dropout.save_pretrained(os.path.join(OUT, "no_embd_dropout"))

    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 128, (2, 16), generator=g)
    reference = {"tokens": tokens, "tied_logits": logits(tied, tokens),
                 "untied_logits": logits(untied, tokens),
                 "no_embd_dropout_logits": logits(no_embd_dropout, tokens % 96)}
    prompts = [[1, 2, 3, 4, 5, 6, 7], [300, 17], [42] * 30]
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = tied.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=NEW_TOKENS, pad_token_id=0)
        reference[f"prompt_{i}"] = ids[0].contiguous()
        reference[f"greedy_{i}"] = out[0, len(prompt):].contiguous()
    save_file(reference, os.path.join(OUT, "reference.safetensors"))
    print("wrote", OUT)

    if len(sys.argv) > 1:
        check_pipit_saves(sys.argv[1], {"tied": tied, "untied": untied,
                                        "no_embd_dropout": no_embd_dropout}, tokens)


def check_pipit_saves(train_gpt, models, tokens):
    """train_gpt reads each checkpoint and saves it back without training; transformers must
    load what it wrote and give the same logits, bit for bit, and the same embd_pdrop."""
    for name, model in models.items():
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([train_gpt, "--init", "hf:" + os.path.join(OUT, name), "--steps", "0",
                            "--save-hf", out, "--sample", "0", "--stages", "1",
                            "--microbatches", "1", "--batch", "1"], check=True)
            again = GPT2LMHeadModel.from_pretrained(out).eval()
            rows = tokens % model.config.vocab_size
            same = (torch.equal(logits(again, rows), logits(model, rows))
                    and again.config.embd_pdrop == model.config.embd_pdrop)
            print(f"{name}: pipit's save loads in transformers with the same logits: {same}")
            if not same:
                sys.exit(1)


if __name__ == "__main__":
    main()
