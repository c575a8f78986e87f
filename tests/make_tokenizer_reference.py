#!/usr/bin/env python3
"""Writes tests/data/tokenizer/: what Hugging Face `tokenizers` makes and encodes, for
tests/tokenizer_test.cpp and tests/bpe_trainer_test.cpp to check pipit against without Python.

Run in a venv outside the repository:
  python3 -m venv /root/.cache/pipit-fixtures
  /root/.cache/pipit-fixtures/bin/pip install tokenizers
  /root/.cache/pipit-fixtures/bin/python tests/make_tokenizer_reference.py \
      /work/shared/data/tinyshakespeare.txt

Writes:
  vocab.json, merges.txt  a GPT-2 style byte-level BPE (3000 tokens) trained on the whole text
  small/tokenizer.json    a 1000-token one trained on train.txt, saved as one file
  train.txt, heldout.txt  the start of the text, and the part after it
  reference.json          texts with the ids both models give them, and the small model's
                          compression (bytes per token) of heldout.txt and its ids' hash
"""
import json
import os
import sys
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = "<|endoftext|>"
TRAIN_BYTES = 120_000
HELDOUT_BYTES = 30_000

TEXTS = [
    "Hello, world!",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "I'll we're they've don't she'd I'm it's you're",
    "DON'T SHE'LL It'S 'tis o'er '''s",
    "multiple   spaces  and\ttabs\t\tand\n\n\nnewlines   \n  end   ",
    " " * 1000,
    "a" + " " * 777 + "b",
    "\n" * 300 + "x",
    "x" * 5000,
    # Long odd runs of letters that merge with themselves: which pair merges first matters.
    "e" * 99 + " " + "l" * 75 + " " + "s" * 61 + " " + "see" * 40,
    "word " * 400,
    "0123456789" * 40 + " 3.14159 1,000,000 42nd",
    "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी में लिखा",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "emoji 👋🏽 🇫🇷 👨‍👩‍👧‍👦 ❤️ 🙂🙂🙂",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n\tif x != 0: pass\r\n",
    "numbers of other scripts: ٣٤٥ ४२ Ⅻ ² ¾ ①",
    "spaces of other kinds:\u00a0nbsp\u3000ideographic\u2028line\u2029para\u0085nel\x0bvt\x0cff",
    # Contractions after them tell a separator (other) from whitespace.
    "separators that are not spaces:\x1cfs\x1dgs\x1ers\x1fus\x1c's\x1d'll\x1e've",
    "Hello<|endoftext|>World",
    "<|endoftext|><|endoftext|> two in a row, and a near miss: <|endoftext| <|endoftext",
    "combining: cafe\u0301 na\u00efve \u0915\u094d\u0937",
    "   leading and trailing   ",
    "",
    "?!.,;:--...'\"\"()[]{}",
]


def byte_level_bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train(path, vocab_size):
    tok = byte_level_bpe()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([path], trainer)
    return tok


def ids(tok, text):
    encoded = tok.encode(text).ids
    assert tok.decode(encoded, skip_special_tokens=False) == text, text
    return encoded


def fnv1a64(ids):
    """FNV-1a over the ids: 30 KB of text's ids checked without storing them."""
    h = 0xCBF29CE484222325
    for i in ids:
        h = ((h ^ i) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    source = sys.argv[1]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizer")
    os.makedirs(os.path.join(out, "small"), exist_ok=True)
    with open(source, "rb") as f:
        data = f.read()
    # Whole lines, so that the training files hold what a line reader sees.
    train_end = data.rindex(b"\n", 0, TRAIN_BYTES) + 1
    heldout_end = data.rindex(b"\n", 0, train_end + HELDOUT_BYTES) + 1
    with open(os.path.join(out, "train.txt"), "wb") as f:
        f.write(data[:train_end])
    with open(os.path.join(out, "heldout.txt"), "wb") as f:
        f.write(data[train_end:heldout_end])
    heldout = data[train_end:heldout_end].decode("utf-8")

    big = train(source, 3000)
    big.model.save(out)
    small = train(os.path.join(out, "train.txt"), 1000)
    small.save(os.path.join(out, "small", "tokenizer.json"))

    heldout_ids = small.encode(heldout).ids
    heldout_tokens = len(heldout_ids)
    reference = {
        "tokenizers_version": __import__("tokenizers").__version__,
        "special_tokens": [SPECIAL],
        "texts": [{"text": t, "ids": ids(big, t), "small_ids": ids(small, t)} for t in TEXTS],
        "heldout": {"vocab_size": 1000, "bytes": len(heldout.encode("utf-8")),
                    "tokens": heldout_tokens, "ids_fnv1a64": fnv1a64(heldout_ids),
                    "bytes_per_token": len(heldout.encode("utf-8")) / heldout_tokens},
    }
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        # One text per line: small, and a diff shows which text changed.
        lines = [json.dumps(t, ensure_ascii=False) for t in reference.pop("texts")]
        head = json.dumps(reference, ensure_ascii=False)[:-1]
        f.write(head + ',\n"texts": [\n' + ",\n".join(lines) + "\n]}\n")
    print(f"{len(TEXTS)} texts; heldout: {heldout_tokens} tokens, "
          f"{reference['heldout']['bytes_per_token']:.4f} bytes/token")


if __name__ == "__main__":
    main()
