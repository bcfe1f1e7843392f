#!/usr/bin/env python3
"""Reads a Plimsoll GPT's model.safetensors the way nanoGPT would, and computes its validation
loss with nanoGPT's forward written out in numpy (float64), as an independent check of the names,
the [out, in] layouts and the numerics of `plimsoll train shakespeare`.

    pip install numpy safetensors
    plimsoll train shakespeare --run-dir run --eval-windows 240
    python3 docs/nanogpt_check.py run/model.safetensors --heads 4 --eval-windows 240

It prints the mean cross-entropy over the same validation windows Plimsoll evaluates (the last 10%
of the plays, `--eval-windows` windows evenly spaced), once with nanoGPT's exact-erf GELU
(`nn.GELU()`) and once with the tanh approximation Plimsoll computes. Compare with the last
`eval_loss` of the run (it evaluates the final model when the step count is a multiple of
`--eval-every`). PyTorch itself is not needed: the forward below is nanoGPT's, op for op.
"""

import argparse
import gzip
import math
import pathlib

import numpy as np
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).resolve().parent.parent


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def linear(x, sd, name, bias=True):
    y = x @ sd[name + ".weight"].T  # nn.Linear: weight is [out, in]
    return y + sd[name + ".bias"] if bias else y


def gelu(x, exact):
    if exact:
        erf = np.frompyfunc(math.erf, 1, 1)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def forward(sd, idx, n_head, exact_gelu):
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    b, t = idx.shape
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:t]
    c = x.shape[-1]
    hd = c // n_head
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        h = layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        q, k, v = np.split(linear(h, sd, p + "attn.c_attn"), 3, axis=-1)
        q, k, v = (a.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3) for a in (q, k, v))
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        att = np.where(mask, -np.inf, att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att = att / att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + linear(y, sd, p + "attn.c_proj")
        h = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        x = x + linear(gelu(linear(h, sd, p + "mlp.c_fc"), exact_gelu), sd, p + "mlp.c_proj")
    x = layer_norm(x, sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"])
    return linear(x, sd, "lm_head", bias=False)


def nanogpt_shapes(n_layer, vocab, block, c):
    """The keys and shapes of nanoGPT's `GPT(config).state_dict()` (bias=True, PyTorch >= 2 so
    no `attn.bias` mask buffer): what `load_state_dict(..., strict=True)` requires."""
    shapes = {
        "transformer.wte.weight": (vocab, c),
        "transformer.wpe.weight": (block, c),
        "transformer.ln_f.weight": (c,),
        "transformer.ln_f.bias": (c,),
        "lm_head.weight": (vocab, c),
    }
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        shapes.update({
            p + "ln_1.weight": (c,), p + "ln_1.bias": (c,),
            p + "attn.c_attn.weight": (3 * c, c), p + "attn.c_attn.bias": (3 * c,),
            p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
            p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
            p + "mlp.c_fc.weight": (4 * c, c), p + "mlp.c_fc.bias": (4 * c,),
            p + "mlp.c_proj.weight": (c, 4 * c), p + "mlp.c_proj.bias": (c,),
        })
    return shapes


def check_strict(sd):
    """What `load_state_dict(strict=True)` checks: no missing key, no unexpected key, every shape
    equal. Also that the head is the token embedding (nanoGPT ties them)."""
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    vocab, c = sd["transformer.wte.weight"].shape
    block = sd["transformer.wpe.weight"].shape[0]
    want = nanogpt_shapes(n_layer, vocab, block, c)
    missing = sorted(set(want) - set(sd))
    unexpected = sorted(set(sd) - set(want))
    wrong = sorted(k for k in want if k in sd and tuple(sd[k].shape) != want[k])
    if missing or unexpected or wrong:
        raise SystemExit(f"not nanoGPT's state_dict: missing {missing}, unexpected {unexpected}, "
                         f"wrong shapes {[(k, sd[k].shape, want[k]) for k in wrong]}")
    if not np.array_equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
        raise SystemExit("lm_head.weight is not transformer.wte.weight (nanoGPT ties them)")
    print(f"strict: the {len(want)} keys and shapes of nanoGPT's GPT(n_layer={n_layer}, "
          f"vocab_size={vocab}, block_size={block}, n_embd={c}).state_dict()")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--eval-windows", type=int, default=240)
    ap.add_argument("--data", default=str(ROOT / "data" / "shakespeare.txt.gz"))
    a = ap.parse_args()
    sd = {k: v.astype(np.float64) for k, v in load_file(a.model).items()}
    check_strict(sd)
    with gzip.open(a.data, "rt", encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    lookup = {ch: i for i, ch in enumerate(vocab)}
    ids = np.array([lookup[ch] for ch in text], dtype=np.int64)
    val = ids[int(len(ids) * 0.9):]
    t = sd["transformer.wpe.weight"].shape[0]
    assert sd["transformer.wte.weight"].shape[0] == len(vocab), "another vocabulary"
    windows = len(val) - t
    count = max(1, min(a.eval_windows, windows))
    starts = [i * windows // count for i in range(count)]
    x = np.stack([val[s:s + t] for s in starts])
    y = np.stack([val[s + 1:s + t + 1] for s in starts])
    for exact in (True, False):
        losses = []
        for lo in range(0, count, 16):
            logits = forward(sd, x[lo:lo + 16], a.heads, exact)
            m = logits.max(-1, keepdims=True)
            logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
            yy = y[lo:lo + 16]
            losses.append(-np.take_along_axis(logp, yy[..., None], -1).squeeze(-1))
        loss = np.concatenate(losses).mean()
        name = "exact (nanoGPT's nn.GELU())" if exact else "tanh (Plimsoll's)"
        print(f"validation loss with GELU {name}: {loss:.6f}")


if __name__ == "__main__":
    main()
