#!/usr/bin/python3
"""Golden losses for a tiny GPT-2 from an independent PyTorch implementation.

Writes, into tests/data/gpt2_golden/:
  model.bin   the initial weights as an llm.c checkpoint (version 3, fp32)
  tokens.bin  random tokens as an llm.c token shard
  golden.txt  per step: step, loss (before the update), lr, grad_norm

The C++ test trains the same model on the same tokens with the same hyper-parameters and
compares. Run once with Debian's python3-torch (system Python):
  /usr/bin/python3 tests/golden/make_gpt2_golden.py
"""
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(20261122)
L, NH, C, MAXT, V = 2, 2, 32, 16, 100
VP = (V + 127) // 128 * 128
B, T, STEPS = 4, 8, 10
LR, WARMUP, MIN_LR_RATIO = 3e-3, 2, 0.1
BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gpt2_golden")


def randn(*shape, std=0.1, mean=0.0):
    return (torch.randn(*shape, dtype=torch.float32) * std + mean).requires_grad_()


# llm.c order; per-layer tensors stacked [L, ...]. Biases and LayerNorm parameters are random
# too, so that every gradient path is exercised.
wte = torch.zeros(VP, C)
wte[:V] = torch.randn(V, C) * 0.1
params = {
    "wte": wte.requires_grad_(), "wpe": randn(MAXT, C),
    "ln1w": randn(L, C, mean=1.0), "ln1b": randn(L, C),
    "qkvw": randn(L, 3 * C, C), "qkvb": randn(L, 3 * C),
    "attprojw": randn(L, C, C), "attprojb": randn(L, C),
    "ln2w": randn(L, C, mean=1.0), "ln2b": randn(L, C),
    "fcw": randn(L, 4 * C, C), "fcb": randn(L, 4 * C),
    "fcprojw": randn(L, C, 4 * C), "fcprojb": randn(L, C),
    "lnfw": randn(C, mean=1.0), "lnfb": randn(C),
}
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def write_model(path):
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, MAXT, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for p in params.values():
            f.write(p.detach().numpy().astype(np.float32).tobytes())


def forward(tokens, targets):
    p = params
    x = p["wte"][tokens] + p["wpe"][: tokens.shape[1]]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = x @ p["wte"].T
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, STEPS - 1 - WARMUP))
    min_lr = LR * MIN_LR_RATIO
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (LR - min_lr)


def main():
    os.makedirs(OUT, exist_ok=True)
    write_model(os.path.join(OUT, "model.bin"))
    tokens = torch.randint(0, V, (STEPS * B * T + 1,), dtype=torch.int64)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, tokens.numel()]
    with open(os.path.join(OUT, "tokens.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.numpy().astype(np.uint16).tobytes())
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if n in DECAYED], "weight_decay": WD},
         {"params": [p for n, p in params.items() if n not in DECAYED], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)
    lines = []
    for step in range(STEPS):
        window = tokens[step * B * T: step * B * T + B * T + 1]
        loss = forward(window[:-1].view(B, T), window[1:].view(B, T))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        lines.append(f"{step + 1} {loss.item():.9g} {lr:.9g} {norm.item():.9g}")
    with open(os.path.join(OUT, "golden.txt"), "w") as f:
        f.write("# step loss lr grad_norm  (torch %s, tests/golden/make_gpt2_golden.py)\n"
                % torch.__version__)
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
