#!/usr/bin/env python3
"""The float64 oracle of nn/tests/golden_trajectory.rs: plimsoll_nn::Gpt trained by AdamW.

    python3 gpt_f64.py IN.json OUT.json

IN.json holds the model's shape, the AdamW hyper-parameters, the initial parameters (name, shape,
row-major values) and one batch of token ids and targets per step. OUT.json gets the mean loss
of each step's batch, before that step's update, and every parameter after the last update.

Written outside the crates, in Python 3 with the standard library only (no numpy), so that it
shares nothing with the kernels it checks. The gradients come from a scalar reverse-mode
autodiff (micrograd's shape): each `Value` records the values it was made from and the partial
derivative of itself with respect to each, and `backward` applies the chain rule over a
topological order. Only the primitives (+, *, **, exp, log, tanh, dot) state a derivative; the
model below is forward code only, so no backward formula of the model is written by hand.
`dot` is one node for a whole sum of products, which keeps the graph to ~25k nodes per step.

The model, as plimsoll_nn::Gpt and nanoGPT's GPT(bias=True, dropout=0):
  x = wte[ids] + wpe[0..T]
  per block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
    attn: q, k, v = split(c_attn(x)) (rows of c_attn.weight: queries, keys, values; heads are
          consecutive runs of head_dim features); y = softmax(q kᵀ / sqrt(head_dim), causal) v;
          c_proj(y)
    mlp:  c_proj(gelu(c_fc(x))), GELU the tanh approximation
  logits = ln_f(x) · wteᵀ (the head tied to the token embedding)
  loss = mean over every position of -log softmax(logits)[target]
Layer norm: (x - mean) / sqrt(var + 1e-5) * weight + bias, biased variance.
AdamW as torch.optim.AdamW: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps); with decay_matrices_only, only
  tensors of rank >= 2 decay (nanoGPT's parameter groups).
"""

import json
import math
import sys
from operator import mul

LAYER_NORM_EPS = 1e-5
GELU_CUBIC = 0.044715
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class Value:
    """A float64 scalar in a graph. `parents` are the values it was computed from and `local`
    holds d(self)/d(parent) for each, fixed when the value is made; `grad` accumulates with +=,
    so a value used twice gets both contributions."""

    __slots__ = ("data", "grad", "parents", "local")

    def __init__(self, data, parents=(), local=()):
        self.data = data
        self.grad = 0.0
        self.parents = parents
        self.local = local

    def __add__(self, other):
        if isinstance(other, Value):
            return Value(self.data + other.data, (self, other), (1.0, 1.0))
        return Value(self.data + other, (self,), (1.0,))

    __radd__ = __add__

    def __mul__(self, other):
        if isinstance(other, Value):
            return Value(self.data * other.data, (self, other), (other.data, self.data))
        return Value(self.data * other, (self,), (other,))

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1.0

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __pow__(self, k):
        # d(x^k)/dx = k x^(k-1), k a constant
        return Value(self.data**k, (self,), (k * self.data ** (k - 1),))

    def exp(self):
        e = math.exp(self.data)
        return Value(e, (self,), (e,))  # d(e^x)/dx = e^x

    def log(self):
        return Value(math.log(self.data), (self,), (1.0 / self.data,))  # d(ln x)/dx = 1/x

    def tanh(self):
        t = math.tanh(self.data)
        return Value(t, (self,), (1.0 - t * t,))  # d(tanh x)/dx = 1 - tanh² x


def dot(xs, ws, bias=None):
    """sum_i xs[i] ws[i] (+ bias) as one node: d/dxs[i] = ws[i], d/dws[i] = xs[i], d/dbias = 1."""
    xd = [x.data for x in xs]
    wd = [w.data for w in ws]
    data = sum(map(mul, xd, wd))
    parents = (*xs, *ws)
    local = (*wd, *xd)
    if bias is not None:
        data += bias.data
        parents += (bias,)
        local += (1.0,)
    return Value(data, parents, local)


def total(xs):
    """sum_i xs[i] as one node (d/dxs[i] = 1)."""
    return Value(sum(x.data for x in xs), tuple(xs), (1.0,) * len(xs))


def backward(root):
    """Sets .grad of every value `root` depends on to d(root)/d(value): the chain rule over a
    topological order (a depth-first post-order, iterative: the graph is deeper than Python's
    recursion limit)."""
    order = []
    seen = set()
    stack = [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((p, False) for p in node.parents if p not in seen)
    root.grad = 1.0
    for node in reversed(order):
        g = node.grad
        for parent, d in zip(node.parents, node.local):
            parent.grad += g * d


# ---- the model, forward only; rows are lists of Values ----


def linear(rows, weight, bias, n_in, n_out):
    """x · Wᵀ + b with W [n_out, n_in] row-major (PyTorch's layout)."""
    w_rows = [weight[o * n_in : (o + 1) * n_in] for o in range(n_out)]
    b = bias if bias is not None else [None] * n_out
    return [[dot(row, w_rows[o], b[o]) for o in range(n_out)] for row in rows]


def layer_norm(rows, weight, bias):
    out = []
    for row in rows:
        n = len(row)
        mean = total(row) * (1.0 / n)
        centred = [x - mean for x in row]
        var = dot(centred, centred) * (1.0 / n)
        inv_std = (var + LAYER_NORM_EPS) ** -0.5
        out.append([centred[i] * inv_std * weight[i] + bias[i] for i in range(n)])
    return out


def gelu(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))."""
    return 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x**3)).tanh())


def softmax(scores):
    # The max is subtracted as a constant: softmax does not change, nor does its derivative.
    top = max(s.data for s in scores)
    exps = [(s - top).exp() for s in scores]
    inv_sum = total(exps) ** -1.0
    return [e * inv_sum for e in exps]


def attention(rows, p, prefix, batch, time, n_embd, n_head):
    """Causal self-attention over rows ordered (batch, time)."""
    qkv = linear(rows, p[prefix + "c_attn.weight"], p[prefix + "c_attn.bias"], n_embd, 3 * n_embd)
    head_dim = n_embd // n_head
    scale = 1.0 / math.sqrt(head_dim)
    y = [[None] * n_embd for _ in rows]
    for b in range(batch):
        seq = qkv[b * time : (b + 1) * time]
        for h in range(n_head):
            lo = h * head_dim
            q = [r[lo : lo + head_dim] for r in seq]
            k = [r[n_embd + lo : n_embd + lo + head_dim] for r in seq]
            v = [r[2 * n_embd + lo : 2 * n_embd + lo + head_dim] for r in seq]
            for t in range(time):
                weights = softmax([dot(q[t], k[s]) * scale for s in range(t + 1)])
                for d in range(head_dim):
                    y[b * time + t][lo + d] = dot(weights, [v[s][d] for s in range(t + 1)])
    return linear(y, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"], n_embd, n_embd)


def mlp(rows, p, prefix, n_embd):
    h = linear(rows, p[prefix + "c_fc.weight"], p[prefix + "c_fc.bias"], n_embd, 4 * n_embd)
    h = [[gelu(x) for x in row] for row in h]
    return linear(h, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"], 4 * n_embd, n_embd)


def add_rows(a, b):
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def gpt_loss(p, config, ids, targets):
    """Mean cross-entropy of the GPT with parameters `p` (name -> flat list of Values) on
    `ids` [batch][time] against `targets` [batch][time]."""
    c, vocab, n_head = config["n_embd"], config["vocab_size"], config["n_head"]
    batch, time = len(ids), len(ids[0])
    wte, wpe = p["transformer.wte.weight"], p["transformer.wpe.weight"]
    x = [
        [wte[tok * c + j] + wpe[t * c + j] for j in range(c)]
        for seq in ids
        for t, tok in enumerate(seq)
    ]
    for layer in range(config["n_layer"]):
        pre = f"transformer.h.{layer}."
        a = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        x = add_rows(x, attention(a, p, pre + "attn.", batch, time, c, n_head))
        m = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        x = add_rows(x, mlp(m, p, pre + "mlp.", c))
    h = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    logits = linear(h, wte, None, c, vocab)
    flat_targets = [tok for seq in targets for tok in seq]
    losses = []
    for row, target in zip(logits, flat_targets):
        top = max(v.data for v in row)
        log_sum = total([(v - top).exp() for v in row]).log() + top
        losses.append(log_sum - row[target])
    return total(losses) * (1.0 / len(losses))


def adamw_step(values, grads, m, v, step, shape, hp):
    """One torch.optim.AdamW update of one tensor in place (lists of floats)."""
    lr, b1, b2, eps = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"]
    decays = len(shape) >= 2 or not hp["decay_matrices_only"]
    decay = 1.0 - lr * hp["weight_decay"] if decays else 1.0
    step_size = lr / (1.0 - b1**step)
    bias_correction2_sqrt = math.sqrt(1.0 - b2**step)
    for i, g in enumerate(grads):
        m[i] = b1 * m[i] + (1.0 - b1) * g
        v[i] = b2 * v[i] + (1.0 - b2) * g * g
        denom = math.sqrt(v[i]) / bias_correction2_sqrt + eps
        values[i] = values[i] * decay - step_size * m[i] / denom


def train(spec):
    config, hp = spec["config"], spec["adamw"]
    params = [(t["name"], t["shape"], [float(x) for x in t["values"]]) for t in spec["parameters"]]
    moments = {name: ([0.0] * len(vals), [0.0] * len(vals)) for name, _, vals in params}
    losses = []
    for step, batch in enumerate(spec["batches"], start=1):
        leaves = {name: [Value(x) for x in vals] for name, _, vals in params}
        loss = gpt_loss(leaves, config, batch["ids"], batch["targets"])
        backward(loss)
        losses.append(loss.data)
        for name, shape, vals in params:
            m, v = moments[name]
            adamw_step(vals, [x.grad for x in leaves[name]], m, v, step, shape, hp)
    return {
        "losses": losses,
        "parameters": [{"name": n, "shape": s, "values": vals} for n, s, vals in params],
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gpt_f64.py IN.json OUT.json")
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = train(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
