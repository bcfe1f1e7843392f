#!/usr/bin/env python3
"""Checks that Plimsoll's token folders and nanoGPT's are the same format, both ways.

    pip install numpy tiktoken
    plimsoll prepare shakespeare --tokenizer gpt2 --out sp
    python3 docs/nanogpt_data_check.py sp --nanogpt-out sp-nanogpt
    plimsoll train gpt --data sp-nanogpt --steps 20      # nanoGPT's folder trains in Plimsoll

1. Reads `sp/train.bin` and `sp/val.bin` with nanoGPT's own `get_batch` logic (`np.memmap` of
   `uint16`, random windows `x = data[i:i+block_size]`, `y = data[i+1:i+1+block_size]`), decodes
   every window with tiktoken's GPT-2 encoding and checks it is a piece of the plays.
2. Checks that `train.bin` followed by `val.bin` is exactly `enc.encode_ordinary(text)` of the
   whole text (what nanoGPT's `data/shakespeare/prepare.py` computes before it splits), and that
   `meta.json` agrees with the files.
3. With `--nanogpt-out DIR`: writes the folder nanoGPT's `prepare.py` writes (the first 90% of
   the characters and the rest, each `encode_ordinary`d, as `uint16` `tofile`; no meta.json),
   for `plimsoll train gpt --data DIR`, which reads it as GPT-2 tokens, as nanoGPT does.

tiktoken downloads GPT-2's merges on first use; on a machine without the network, give
`--bpe FILE`, a local `r50k_base.tiktoken` (the tiktoken-rs crate ships one under `assets/`).
"""

import argparse
import gzip
import json
import os
import pathlib

import numpy as np
import tiktoken

ROOT = pathlib.Path(__file__).resolve().parent.parent

GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def gpt2_encoding(bpe_file):
    if bpe_file is None:
        return tiktoken.get_encoding("gpt2")
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=load_tiktoken_bpe(bpe_file),
        special_tokens={"<|endoftext|>": 50256},
    )


def get_batch(data_dir, split, block_size, batch_size, rng):
    """nanoGPT's train.py get_batch, with numpy's generator for torch.randint."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = rng.integers(0, len(data) - block_size, size=(batch_size,))
    x = np.stack([data[i : i + block_size].astype(np.int64) for i in ix])
    y = np.stack([data[i + 1 : i + 1 + block_size].astype(np.int64) for i in ix])
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", help="a folder from plimsoll prepare shakespeare --tokenizer gpt2")
    ap.add_argument("--text", default=str(ROOT / "data" / "shakespeare.txt.gz"))
    ap.add_argument("--bpe", default=None, help="a local r50k_base.tiktoken")
    ap.add_argument("--nanogpt-out", default=None)
    ap.add_argument("--block-size", type=int, default=64)
    args = ap.parse_args()

    enc = gpt2_encoding(args.bpe)
    raw = pathlib.Path(args.text).read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    folder = pathlib.Path(args.folder)
    meta = json.loads((folder / "meta.json").read_text())

    rng = np.random.default_rng(1337)
    for split in ("train", "val"):
        x, y = get_batch(folder, split, args.block_size, 12, rng)
        assert x.shape == y.shape == (12, args.block_size), x.shape
        assert (x[:, 1:] == y[:, :-1]).all(), "y is x moved by one token"
        assert x.max() < meta["vocab_size"], x.max()
        for row in x:
            piece = enc.decode(row.tolist())
            # A window may start or end inside a character: compare whole characters.
            inner = piece.strip("\ufffd")[1:-1]
            assert inner in text, f"{split}: a window is not a piece of the text: {piece!r}"
        print(f"{split}: nanoGPT's get_batch read 12 windows of {args.block_size}; "
              f"decoded, each is a piece of the plays, e.g. {enc.decode(x[0].tolist())[:60]!r}")

    train = np.fromfile(folder / "train.bin", dtype=np.uint16)
    val = np.fromfile(folder / "val.bin", dtype=np.uint16)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257, meta
    assert meta["train_tokens"] == len(train) and meta["val_tokens"] == len(val), meta
    whole = enc.encode_ordinary(text)
    ours = np.concatenate([train, val]).tolist()
    assert ours == whole, (
        f"train.bin + val.bin ({len(ours)} tokens) differ from encode_ordinary of the text "
        f"({len(whole)})"
    )
    print(f"train.bin + val.bin = tiktoken's encode_ordinary(text): {len(whole)} tokens, "
          f"{len(train)} / {len(val)}; meta.json agrees")

    if args.nanogpt_out:
        out = pathlib.Path(args.nanogpt_out)
        out.mkdir(parents=True, exist_ok=True)
        n = len(text)
        train_ids = enc.encode_ordinary(text[: int(n * 0.9)])
        val_ids = enc.encode_ordinary(text[int(n * 0.9) :])
        np.array(train_ids, dtype=np.uint16).tofile(out / "train.bin")
        np.array(val_ids, dtype=np.uint16).tofile(out / "val.bin")
        print(f"wrote nanoGPT's prepare.py folder {out}: {len(train_ids)} / {len(val_ids)} "
              f"tokens; train on it with: plimsoll train gpt --data {out}")


if __name__ == "__main__":
    main()
