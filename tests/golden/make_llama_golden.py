#!/usr/bin/python3
"""A tiny Llama-family decoder trained for 10 AdamW steps in PyTorch: the golden that freeride's
CPU Llama (models/llama.h) is held to.

Writes, into tests/data/llama_golden/:
  golden.json   the config, the optimizer's settings, the 10 batches of tokens (B sequences of
                T + 1 ids: inputs are the first T, targets the last T) and the mean loss of each
                step, computed before that step's update
  init.bin      float32 initial parameters in freeride's layout (models/gpt2_config.h: wte
                [Vp, C], ln1w [L, C], qkvw [L, C + 2·kv, C] as [q; k; v], attprojw [L, C, C],
                ln2w [L, C], fcw [L, 2F, C] as [gate; up], fcprojw [L, C, F], lnfw [C], lmhead
                [Vp, C]; padded vocabulary rows 0)
  grads1.bin    float32 gradients of step 1's mean loss, in the same layout

The model is written out from the Llama definition (RMSNorm x·rsqrt(mean(x²) + eps)·w, rotary
embeddings in Hugging Face's rotate-half layout on q and k with cos and sin computed in float64,
grouped-query attention where query head h reads key/value head h // (NH / NKV), causal softmax
scaled by 1/sqrt(head size), SwiGLU silu(gate)·up, no biases, an untied head) and trained with
torch.optim.AdamW (weight decay on the matrices only, as freeride decays them), all in float32.
Run with Debian's python3-torch (system Python); the test suite does not need torch:
  /usr/bin/python3 tests/golden/make_llama_golden.py
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20261127)
L, NH, NKV, C, MAXT, V = 2, 4, 2, 32, 16, 100
HS = C // NH
KV = NKV * HS
FFN = 96  # Llama 3's rounding of 2/3 · 4C = 85 up to a multiple of 32
THETA, EPS = 10000.0, 1e-5
B, T, STEPS = 2, 8, 10
LR, BETAS, ADAM_EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1
VP = (V + 127) // 128 * 128
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "llama_golden")


def randn(*shape, std=0.1, mean=0.0):
    return (torch.randn(*shape, dtype=torch.float32) * std + mean).requires_grad_()


# freeride's tensor order; ln weights near 1 so that they matter.
params = {
    "wte": randn(V, C),
    "ln1w": randn(L, C, mean=1.0),
    "qkvw": randn(L, C + 2 * KV, C),
    "attprojw": randn(L, C, C),
    "ln2w": randn(L, C, mean=1.0),
    "fcw": randn(L, 2 * FFN, C),
    "fcprojw": randn(L, C, FFN),
    "lnfw": randn(C, mean=1.0),
    "lmhead": randn(V, C),
}
DECAYED = {"wte", "qkvw", "attprojw", "fcw", "fcprojw", "lmhead"}

pos = torch.arange(T, dtype=torch.float64)
inv_freq = THETA ** (-torch.arange(0, HS // 2, dtype=torch.float64) * 2.0 / HS)
angles = torch.outer(pos, inv_freq)  # [T, HS/2]
COS = torch.cos(angles).to(torch.float32)
SIN = torch.sin(angles).to(torch.float32)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x):  # x [B, T, H, HS]
    x1, x2 = x[..., : HS // 2], x[..., HS // 2:]
    c, s = COS[None, :, None, :], SIN[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def forward(p, idx, tgt):
    x = p["wte"][idx]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = rmsnorm(x, p["ln1w"][l])
        qkv = h @ p["qkvw"][l].T
        q = rope(qkv[..., :C].reshape(B, T, NH, HS))
        k = rope(qkv[..., C:C + KV].reshape(B, T, NKV, HS))
        v = qkv[..., C + KV:].reshape(B, T, NKV, HS)
        k = k.repeat_interleave(NH // NKV, dim=2)
        v = v.repeat_interleave(NH // NKV, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, NH, T, HS]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T
        g = rmsnorm(x, p["ln2w"][l]) @ p["fcw"][l].T
        x = x + (F.silu(g[..., :FFN]) * g[..., FFN:]) @ p["fcprojw"][l].T
    logits = rmsnorm(x, p["lnfw"]) @ p["lmhead"].T
    return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def flat(tensors):
    """freeride's buffer: the tensors in order, wte and lmhead padded to VP rows."""
    parts = []
    for name, t in tensors.items():
        t = t.detach()
        if name in ("wte", "lmhead"):
            t = torch.cat([t, torch.zeros(VP - V, C)])
        parts.append(t.reshape(-1))
    return torch.cat(parts).numpy().astype("<f4").tobytes()


batches = torch.randint(0, V, (STEPS, B, T + 1))
init = flat(params)
opt = torch.optim.AdamW(
    [{"params": [params[n] for n in params if n in DECAYED], "weight_decay": WD},
     {"params": [params[n] for n in params if n not in DECAYED], "weight_decay": 0.0}],
    lr=LR, betas=BETAS, eps=ADAM_EPS)
losses = []
for step in range(STEPS):
    opt.zero_grad()
    loss = forward(params, batches[step, :, :-1], batches[step, :, 1:])
    loss.backward()
    if step == 0:
        grads1 = flat({n: p.grad for n, p in params.items()})
    losses.append(loss.item())
    opt.step()

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "init.bin"), "wb") as f:
    f.write(init)
with open(os.path.join(OUT, "grads1.bin"), "wb") as f:
    f.write(grads1)
golden = {
    "model": {"n_layer": L, "n_head": NH, "n_kv_head": NKV, "n_embd": C, "max_seq_len": MAXT,
              "vocab_size": V, "ffn_hidden": FFN, "rope_theta": THETA, "norm_eps": EPS,
              "tie_embeddings": False},
    "optim": {"lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": ADAM_EPS,
              "weight_decay": WD},
    "batch_size": B, "seq_len": T,
    "tokens": batches.reshape(STEPS, -1).tolist(),
    "losses": losses,
}
with open(os.path.join(OUT, "golden.json"), "w") as f:
    json.dump(golden, f, indent=1)
    f.write("\n")
print("losses:", " ".join(f"{x:.6f}" for x in losses))
