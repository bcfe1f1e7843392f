#!/usr/bin/env python3
"""Reads the model.safetensors of a Plimsoll ResNet run the way torchvision would, and computes
its evaluation loss with torchvision's forward written out in numpy (float64), as an independent
check of the names, the [out, in, kh, kw] layouts, BatchNorm's buffers and the numerics of
`plimsoll train resnet18` (or 34, 50, 101, 152).

    pip install numpy safetensors
    plimsoll train resnet18 --image 32 --batch 8 --steps 12 --classes 10 --run-dir run
    python3 docs/torchvision_check.py run

It checks the file against `torchvision.models.resnet18(num_classes=10).state_dict()` as
torchvision builds it (no missing key, no unexpected key, every shape and dtype equal, each
`num_batches_tracked` a 0-d int64: what `load_state_dict(..., strict=True)` needs), then makes the
run's held-out synthetic images again (the same SplitMix64 recipe under the run's seed XOR 0x7E57),
runs the network in evaluation mode (BatchNorm from its running statistics) and prints the mean
cross-entropy and the accuracy beside the run's last `eval_loss` and `eval_accuracy`. It exits
with status 1 when a key, shape or dtype differs or the losses differ by more than 1e-4 of the
larger of 1 and the loss.
PyTorch is not needed: the forward below follows torchvision's resnet.py op for op.
"""

import argparse
import json
import pathlib
import re
import sys

import numpy as np
from safetensors.numpy import load_file

LAYERS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
          50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
          152: ("bottleneck", [3, 8, 36, 3])}


def torchvision_shapes(depth, classes):
    """resnet{depth}(num_classes=classes).state_dict(): name -> (shape, dtype)."""
    kind, layers = LAYERS[depth]
    expansion = 1 if kind == "basic" else 4
    shapes = {}

    def bn(name, c):
        for b in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.{b}"] = ((c,), "float32")
        shapes[f"{name}.num_batches_tracked"] = ((), "int64")

    shapes["conv1.weight"] = ((64, 3, 7, 7), "float32")
    bn("bn1", 64)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip([64, 128, 256, 512], layers)):
        for i in range(blocks):
            p = f"layer{stage + 1}.{i}."
            stride = 2 if stage > 0 and i == 0 else 1
            if kind == "basic":
                shapes[p + "conv1.weight"] = ((planes, inplanes, 3, 3), "float32")
                bn(p + "bn1", planes)
                shapes[p + "conv2.weight"] = ((planes, planes, 3, 3), "float32")
                bn(p + "bn2", planes)
            else:
                shapes[p + "conv1.weight"] = ((planes, inplanes, 1, 1), "float32")
                bn(p + "bn1", planes)
                shapes[p + "conv2.weight"] = ((planes, planes, 3, 3), "float32")
                bn(p + "bn2", planes)
                shapes[p + "conv3.weight"] = ((planes * 4, planes, 1, 1), "float32")
                bn(p + "bn3", planes * 4)
            if stride != 1 or inplanes != planes * expansion:
                shapes[p + "downsample.0.weight"] = ((planes * expansion, inplanes, 1, 1),
                                                     "float32")
                bn(p + "downsample.1", planes * expansion)
            inplanes = planes * expansion
    shapes["fc.weight"] = ((classes, 512 * expansion), "float32")
    shapes["fc.bias"] = ((classes,), "float32")
    return shapes


M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(z):
    """SplitMix64's output function on uint64 arrays (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def synthetic(n, chw, classes, seed):
    """SyntheticImages: value j of image i is mix(seed ^ mix(i << 32 ^ j)) >> 40 over 2^23,
    minus 1; the label of image i is mix((seed + 0x9E37) ^ i) % classes."""
    width = int(np.prod(chw))
    i = np.arange(n, dtype=np.uint64)[:, None]
    j = np.arange(width, dtype=np.uint64)[None, :]
    bits = mix(np.uint64(seed) ^ mix((i << np.uint64(32)) ^ j))
    x = (bits >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0
    with np.errstate(over="ignore"):
        label_seed = np.uint64(seed) + np.uint64(0x9E37)
    labels = mix(label_seed ^ np.arange(n, dtype=np.uint64)) % np.uint64(classes)
    return x.reshape((n, *chw)), labels.astype(np.int64)


def conv(x, w, stride, padding):
    """nn.Conv2d without bias: x [N, C, H, W], w [O, C, kh, kw]."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    cols = np.empty((n, c, kh, kw, oh, ow))
    for a in range(kh):
        for b in range(kw):
            cols[:, :, a, b] = x[:, :, a:a + stride * oh:stride, b:b + stride * ow:stride]
    return np.einsum("ncklhw,ockl->nohw", cols, w)


def batch_norm(x, sd, name, eps=1e-5):
    """nn.BatchNorm2d in evaluation mode: the running statistics."""
    g = lambda k: sd[f"{name}.{k}"][None, :, None, None]
    return (x - g("running_mean")) / np.sqrt(g("running_var") + eps) * g("weight") + g("bias")


def max_pool(x):
    """nn.MaxPool2d(kernel_size=3, stride=2, padding=1)."""
    n, c, h, w = x.shape
    x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    out = np.full((n, c, oh, ow), -np.inf)
    for a in range(3):
        for b in range(3):
            out = np.maximum(out, x[:, :, a:a + 2 * oh:2, b:b + 2 * ow:2])
    return out


def forward(sd, x, depth):
    """torchvision's ResNet.forward in evaluation mode."""
    kind, layers = LAYERS[depth]
    relu = lambda t: np.maximum(t, 0.0)
    x = relu(batch_norm(conv(x, sd["conv1.weight"], 2, 3), sd, "bn1"))
    x = max_pool(x)
    for stage, blocks in enumerate(layers):
        for i in range(blocks):
            p = f"layer{stage + 1}.{i}."
            stride = 2 if stage > 0 and i == 0 else 1
            identity = x
            if kind == "basic":
                out = relu(batch_norm(conv(x, sd[p + "conv1.weight"], stride, 1), sd, p + "bn1"))
                out = batch_norm(conv(out, sd[p + "conv2.weight"], 1, 1), sd, p + "bn2")
            else:
                out = relu(batch_norm(conv(x, sd[p + "conv1.weight"], 1, 0), sd, p + "bn1"))
                out = relu(batch_norm(conv(out, sd[p + "conv2.weight"], stride, 1), sd,
                                      p + "bn2"))
                out = batch_norm(conv(out, sd[p + "conv3.weight"], 1, 0), sd, p + "bn3")
            if p + "downsample.0.weight" in sd:
                identity = batch_norm(conv(x, sd[p + "downsample.0.weight"], stride, 0), sd,
                                      p + "downsample.1")
            x = relu(out + identity)
    x = x.mean(axis=(2, 3))
    return x @ sd["fc.weight"].T + sd["fc.bias"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=pathlib.Path, help="the run directory (--run-dir)")
    args = ap.parse_args()
    run = json.loads((args.run / "run.json").read_text())
    depth = int(re.fullmatch(r"resnet(\d+)", run["workload"]).group(1))
    held_out = re.fullmatch(r"(\d+) synthetic (\d+)x(\d+)x(\d+) images, (\d+) classes",
                            run["eval_data"] or "")
    if held_out is None:
        sys.exit(f"{args.run}: the run evaluated no synthetic images (--eval-images 0?)")
    n, c, h, w, classes = map(int, held_out.groups())
    seed = int(run["config"]["seed"])

    raw = load_file(str(args.run / "model.safetensors"))
    want = torchvision_shapes(depth, classes)
    missing = sorted(set(want) - set(raw))
    unexpected = sorted(set(raw) - set(want))
    wrong = sorted(k for k in set(want) & set(raw)
                   if (tuple(raw[k].shape), str(raw[k].dtype)) != want[k])
    print(f"resnet{depth}(num_classes={classes}).state_dict(): {len(want)} entries; the file: "
          f"{len(raw)}; missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shape or "
          f"dtype {[(k, raw[k].shape, raw[k].dtype) for k in wrong[:5]]}")
    if missing or unexpected or wrong:
        sys.exit(1)

    sd = {k: v.astype(np.float64) for k, v in raw.items()}
    x, labels = synthetic(n, (c, h, w), classes, seed ^ 0x7E57)
    logits = forward(sd, x, depth)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(n), labels].mean())
    accuracy = float((logits.argmax(axis=1) == labels).mean())
    evals = [json.loads(line) for line in (args.run / "metrics.jsonl").read_text().splitlines()
             if '"eval_loss"' in line]
    if not evals:
        sys.exit(f"{args.run}/metrics.jsonl has no evaluation")
    last = evals[-1]
    print(f"numpy (float64, evaluation mode) over {n} held-out images: loss {loss:.6f}, "
          f"accuracy {accuracy:.4f}")
    print(f"the run's last evaluation (step {last['step']}): loss {last['eval_loss']:.6f}, "
          f"accuracy {last['eval_accuracy']:.4f}")
    gap = abs(loss - last["eval_loss"]) / max(1.0, abs(loss))
    print(f"relative difference {gap:.2e}")
    if gap > 1e-4:
        sys.exit(1)


if __name__ == "__main__":
    main()
