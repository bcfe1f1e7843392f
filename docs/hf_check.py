#!/usr/bin/env python3
"""Reads a Plimsoll run exported in Hugging Face's layout (model.safetensors and config.json,
`plimsoll train shakespeare --export hf`, or any `--arch llama` run) the way `from_pretrained`
would, and computes its validation loss with Hugging Face's forward written out in numpy
(float64): GPT2LMHeadModel (Conv1D weights [in, out], GELU "gelu_new") or LlamaForCausalLM
(RMSNorm, rotary embeddings in the rotate-half layout, grouped-query attention, SwiGLU).

    pip install numpy safetensors
    plimsoll train shakespeare --arch llama --run-dir run
    python3 docs/hf_check.py run

It checks the keys and shapes against the model's own state_dict as transformers builds it from
config.json (no missing key, no unexpected key, every shape equal: what `from_pretrained` needs
to load the folder without warnings), then prints the mean cross-entropy over the validation
windows Plimsoll evaluates. Compare it with the run's last `eval_loss`. PyTorch and transformers
are not needed: the forward below follows modeling_gpt2.py and modeling_llama.py op for op.
"""

import argparse
import gzip
import json
import math
import pathlib

import numpy as np
from safetensors.numpy import load_file

from nanogpt_check import layer_norm, gelu

ROOT = pathlib.Path(__file__).resolve().parent.parent


def gpt2_shapes(cfg):
    """GPT2LMHeadModel(config).state_dict() keys and shapes (recent transformers: the causal
    mask buffers are not persistent)."""
    c, v, n = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    inner = cfg.get("n_inner") or 4 * c
    shapes = {"transformer.wte.weight": (v, c), "transformer.wpe.weight": (n, c),
              "transformer.ln_f.weight": (c,), "transformer.ln_f.bias": (c,),
              "lm_head.weight": (v, c)}
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        shapes.update({
            p + "ln_1.weight": (c,), p + "ln_1.bias": (c,),
            p + "attn.c_attn.weight": (c, 3 * c), p + "attn.c_attn.bias": (3 * c,),
            p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
            p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
            p + "mlp.c_fc.weight": (c, inner), p + "mlp.c_fc.bias": (inner,),
            p + "mlp.c_proj.weight": (inner, c), p + "mlp.c_proj.bias": (c,),
        })
    return shapes


def llama_shapes(cfg):
    """LlamaForCausalLM(config).state_dict() keys and shapes (a tied head is left out of the
    file by save_pretrained, and tied again by from_pretrained)."""
    c, v, m = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or c // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (v, c), "model.norm.weight": (c,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (v, c)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c,), p + "post_attention_layernorm.weight": (c,),
            p + "self_attn.q_proj.weight": (q, c), p + "self_attn.k_proj.weight": (kv, c),
            p + "self_attn.v_proj.weight": (kv, c), p + "self_attn.o_proj.weight": (c, q),
            p + "mlp.gate_proj.weight": (m, c), p + "mlp.up_proj.weight": (m, c),
            p + "mlp.down_proj.weight": (c, m),
        })
    return shapes


def check_keys(sd, want, what):
    missing = sorted(set(want) - set(sd))
    unexpected = sorted(set(sd) - set(want))
    wrong = sorted(k for k in want if k in sd and tuple(sd[k].shape) != want[k])
    if missing or unexpected or wrong:
        raise SystemExit(f"not {what}'s state_dict: missing {missing}, unexpected {unexpected}, "
                         f"wrong shapes {[(k, sd[k].shape, want[k]) for k in wrong]}")
    print(f"keys: the {len(want)} keys and shapes of {what} from config.json")


def causal_softmax_attention(q, k, v):
    """softmax(q kᵀ / sqrt(d), causal) v over [B, H, T, D]."""
    t, d = q.shape[-2], q.shape[-1]
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    att = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, att)
    att = np.exp(att - att.max(-1, keepdims=True))
    return (att / att.sum(-1, keepdims=True)) @ v


def gpt2_forward(sd, cfg, idx):
    b, t = idx.shape
    c, nh = cfg["n_embd"], cfg["n_head"]
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:t]
    conv1d = lambda h, name: h @ sd[name + ".weight"] + sd[name + ".bias"]  # [in, out]
    heads = lambda a: a.reshape(b, t, nh, c // nh).transpose(0, 2, 1, 3)
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps)
        q, k, v = np.split(conv1d(h, p + "attn.c_attn"), 3, axis=-1)
        y = causal_softmax_attention(heads(q), heads(k), heads(v))
        x = x + conv1d(y.transpose(0, 2, 1, 3).reshape(b, t, c), p + "attn.c_proj")
        h = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
        x = x + conv1d(gelu(conv1d(h, p + "mlp.c_fc"), exact=False), p + "mlp.c_proj")
    x = layer_norm(x, sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"], eps)
    return x @ sd["transformer.wte.weight"].T  # the head is tied


def llama_forward(sd, cfg, idx):
    b, t = idx.shape
    c, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or c // nh
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    lin = lambda h, name: h @ sd[name + ".weight"].T  # nn.Linear, no bias
    # LlamaRotaryEmbedding: inv_freq = 1 / theta^(2i / d); cos/sin of cat(freqs, freqs).
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(t), inv_freq)
    cos, sin = np.cos(np.concatenate([freqs] * 2, -1)), np.sin(np.concatenate([freqs] * 2, -1))
    rotate_half = lambda x: np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    rope = lambda x: x * cos + rotate_half(x) * sin
    heads = lambda a, n: a.reshape(b, t, n, hd).transpose(0, 2, 1, 3)
    x = sd["model.embed_tokens.weight"][idx]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rope(heads(lin(h, p + "self_attn.q_proj"), nh))
        k = rope(heads(lin(h, p + "self_attn.k_proj"), nkv))
        v = heads(lin(h, p + "self_attn.v_proj"), nkv)
        # repeat_kv: each key/value head serves nh / nkv consecutive query heads.
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        y = causal_softmax_attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
        x = x + lin(y, p + "self_attn.o_proj")
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate = lin(h, p + "mlp.gate_proj")
        x = x + lin(gate / (1.0 + np.exp(-gate)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, sd["model.norm.weight"])
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run", help="the run's folder (model.safetensors and config.json)")
    ap.add_argument("--eval-windows", type=int, default=240)
    ap.add_argument("--data", default=str(ROOT / "data" / "shakespeare.txt.gz"))
    a = ap.parse_args()
    run = pathlib.Path(a.run)
    cfg = json.loads((run / "config.json").read_text())
    sd = {k: v.astype(np.float64) for k, v in load_file(run / "model.safetensors").items()}
    if cfg["model_type"] == "gpt2":
        check_keys(sd, gpt2_shapes(cfg), "GPT2LMHeadModel")
        forward, context = gpt2_forward, cfg["n_positions"]
    elif cfg["model_type"] == "llama":
        check_keys(sd, llama_shapes(cfg), "LlamaForCausalLM")
        forward, context = llama_forward, cfg["max_position_embeddings"]
    else:
        raise SystemExit(f"model_type {cfg['model_type']!r}: not gpt2 or llama")
    with gzip.open(a.data, "rt", encoding="utf-8") as f:
        text = f.read()
    lookup = {ch: i for i, ch in enumerate(sorted(set(text)))}
    ids = np.array([lookup[ch] for ch in text], dtype=np.int64)
    val = ids[int(len(ids) * 0.9):]
    windows = len(val) - context
    count = max(1, min(a.eval_windows, windows))
    starts = [i * windows // count for i in range(count)]
    x = np.stack([val[s:s + context] for s in starts])
    y = np.stack([val[s + 1:s + context + 1] for s in starts])
    losses = []
    for lo in range(0, count, 16):
        logits = forward(sd, cfg, x[lo:lo + 16])
        m = logits.max(-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        losses.append(-np.take_along_axis(logp, y[lo:lo + 16][..., None], -1).squeeze(-1))
    print(f"validation loss ({cfg['model_type']}, Hugging Face's forward in numpy): "
          f"{np.concatenate(losses).mean():.6f}")


if __name__ == "__main__":
    main()
