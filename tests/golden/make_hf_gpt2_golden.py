#!/usr/bin/python3
"""A tiny GPT-2 as Hugging Face stores it, and its logits from an independent PyTorch forward.

Writes, into tests/data/hf_gpt2_golden/:
  config.json, model.safetensors   GPT2LMHeadModel's config and weights (fp32), the tensor names
                                   and Conv1D layouts (weights [in, out]) transformers loads
  bf16/, fp16/                     the same weights as torch rounds them to bfloat16 and float16
  tokens.txt                       one sequence of token ids
  logits.bin                       float32 [T, V]: the model's logits at every position

The forward is HF's GPT2LMHeadModel written out (Conv1D x @ W + b, gelu_new, LayerNorm eps
1e-5, attention scaled by 1/sqrt(head size), causal, head tied to wte), so the C++ test that
imports the directory and decodes the tokens checks freeride's name map and transposes against
it; the safetensors files are written here by hand from the format's definition, so the reader
is checked against a writer that is not its own. Run with Debian's python3-torch (system
Python):
  /usr/bin/python3 tests/golden/make_hf_gpt2_golden.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

torch.manual_seed(20261127)
L, NH, C, MAXT, V = 2, 2, 32, 16, 100
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf_gpt2_golden")
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def randn(*shape, std=0.1, mean=0.0):
    return torch.randn(*shape, dtype=torch.float32) * std + mean


# GPT2LMHeadModel.state_dict()'s order and shapes (lm_head.weight is tied: not stored).
weights = {"transformer.wte.weight": randn(V, C), "transformer.wpe.weight": randn(MAXT, C)}
for l in range(L):
    h = f"transformer.h.{l}."
    weights.update({
        h + "ln_1.weight": randn(C, mean=1.0), h + "ln_1.bias": randn(C),
        h + "attn.c_attn.weight": randn(C, 3 * C), h + "attn.c_attn.bias": randn(3 * C),
        h + "attn.c_proj.weight": randn(C, C), h + "attn.c_proj.bias": randn(C),
        h + "ln_2.weight": randn(C, mean=1.0), h + "ln_2.bias": randn(C),
        h + "mlp.c_fc.weight": randn(C, 4 * C), h + "mlp.c_fc.bias": randn(4 * C),
        h + "mlp.c_proj.weight": randn(4 * C, C), h + "mlp.c_proj.bias": randn(C),
    })
weights["transformer.ln_f.weight"] = randn(C, mean=1.0)
weights["transformer.ln_f.bias"] = randn(C)


def write_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.float32 \
            else t.contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def config(torch_dtype):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
            "n_positions": MAXT, "n_embd": C, "n_layer": L, "n_head": NH, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
            "tie_word_embeddings": True, "torch_dtype": torch_dtype}


def forward(tokens):
    w = weights
    T = tokens.shape[0]
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D
        q, k, v = (t.view(T, NH, hs).transpose(0, 1) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps=1e-5)
    return x @ w["transformer.wte.weight"].T


def main():
    for sub, dtype, name in [("", torch.float32, "float32"), ("bf16", torch.bfloat16, "bfloat16"),
                             ("fp16", torch.float16, "float16")]:
        d = os.path.join(OUT, sub)
        os.makedirs(d, exist_ok=True)
        write_safetensors(os.path.join(d, "model.safetensors"),
                          {n: t.to(dtype) for n, t in weights.items()})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config(name), f, indent=2)
            f.write("\n")
    tokens = torch.randint(0, V, (MAXT,), dtype=torch.int64)
    with torch.no_grad():
        logits = forward(tokens).to(torch.float32)
    with open(os.path.join(OUT, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens.tolist()) + "\n")
    with open(os.path.join(OUT, "logits.bin"), "wb") as f:
        f.write(logits.contiguous().numpy().tobytes())
    print(f"wrote {OUT}: torch {torch.__version__}, logits {list(logits.shape)}")


if __name__ == "__main__":
    main()
