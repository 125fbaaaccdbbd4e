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

With --hf DIR --name NAME it instead reads a Hugging Face model directory as `freeride export
--format hf` writes it (config.json, and model.safetensors or shards with
model.safetensors.index.json; F32, BF16 or F16 tensors), parsing safetensors with the standard
library (an 8-byte little-endian header length, the JSON header, the raw bytes), runs
LlamaForCausalLM's forward written out from transformers' definition (its float32 rotary
tables, RMSNorm, repeat_kv, SwiGLU, lm_head or the tied embedding) over a fixed token sequence of
max_position_embeddings tokens, and writes into tests/data/llama_golden/:
  hf_NAME.json         the tokens, config.json as read, and each safetensors file's size and
                       CRC-32 (zlib's), so that a test can tell it exported these very bytes
  hf_NAME_logits.bin   float32 [T, vocab_size]: the logits at every position
tests/trainer/llama_hf_golden_test.cc exports the golden model (init.bin, untied and tied) and
holds freeride's logits to these:
  build/freeride export --format hf MODEL.bin DIR   (the test writes MODEL.bin; see there)
  /usr/bin/python3 tests/golden/make_llama_golden.py --hf DIR --name untied
"""
import argparse
import json
import math
import os
import struct
import zlib

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


def make_training_golden():
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


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """Every tensor of one safetensors file, widened to float32, by name."""
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).to(torch.float32)
    return tensors


def read_hf_directory(d):
    """config.json, the tensors (one file or the shards an index names), and each file's size
    and CRC-32."""
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors, sums = {}, {}
    for name in files:
        path = os.path.join(d, name)
        with open(path, "rb") as f:
            raw = f.read()
        sums[name] = {"bytes": len(raw), "crc32": zlib.crc32(raw)}
        tensors.update(read_safetensors(path))
    return config, tensors, sums


def hf_llama_logits(config, w, tokens):
    """LlamaForCausalLM's forward (transformers' modeling_llama, eager attention) in float32."""
    n_layer, n_head = config["num_hidden_layers"], config["num_attention_heads"]
    n_kv, hidden = config["num_key_value_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // n_head
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    n = tokens.shape[0]

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    # LlamaRotaryEmbedding: inv_freq and the angles in float32, cos/sin of [freqs, freqs].
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [T, 1, head_dim]

    def rotate_half(x):
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        return torch.cat([-x2, x1], dim=-1)

    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    x = w["model.embed_tokens.weight"][tokens]
    for l in range(n_layer):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, n_head, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, n_kv, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, n_kv, head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(n_head // n_kv, dim=1)  # repeat_kv
        v = v.repeat_interleave(n_head // n_kv, dim=1)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, T, head_dim]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(n, n_head * head_dim)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    tied = config.get("tie_word_embeddings", False)
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return x @ head.T


def make_hf_golden(directory, name):
    config, tensors, sums = read_hf_directory(directory)
    n = config["max_position_embeddings"]
    tokens = torch.randint(0, config["vocab_size"], (n,),
                           generator=torch.Generator().manual_seed(20261128))
    with torch.no_grad():
        logits = hf_llama_logits(config, tensors, tokens).to(torch.float32)
    with open(os.path.join(OUT, f"hf_{name}_logits.bin"), "wb") as f:
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    record = {"tokens": tokens.tolist(), "config": config, "files": sums,
              "torch": torch.__version__}
    with open(os.path.join(OUT, f"hf_{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote hf_{name}: logits {list(logits.shape)} from {sorted(sums)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf", metavar="DIR", help="an exported Hugging Face directory")
    parser.add_argument("--name", help="the data's name with --hf (hf_NAME.json)")
    args = parser.parse_args()
    if args.hf:
        if not args.name:
            parser.error("--hf needs --name")
        make_hf_golden(args.hf, args.name)
    else:
        make_training_golden()


if __name__ == "__main__":
    main()
