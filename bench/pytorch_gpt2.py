#!/usr/bin/env python3
"""PyTorch GPT-2 124M training throughput: the reference bench/gpu_train_bench is compared with.

The nanoGPT recipe on one GPU: bf16 autocast, torch.compile, scaled_dot_product_attention
(flash attention), fused AdamW, tied embeddings, random tokens, T = 1024. Prints tokens/s,
MFU against the device's dense bf16 peak and peak memory, in the same form as
gpu_train_bench so that bench/gpu/bench.sh can put them side by side.

Usage: pytorch_gpt2.py [--steps 20] [--batch 8] [--seq 1024] [--no-compile]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, NH=12, V=50304, T=1024):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def peak_bf16_flops(name):
    if "H200" in name:
        return 989.4e12
    if "H100" in name:
        return 756.0e12 if "PCIe" in name else 989.4e12
    if "A100" in name:
        return 312.0e12
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    L, C, NH, V, T, B = 12, 768, 12, 50304, args.seq, args.batch
    model = GPT(L, C, NH, V, 1024).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = model if args.no_compile else torch.compile(model)
    n_params = sum(p.numel() for p in model.parameters())
    # The same count freeride uses (models/gpt2_config.cc TrainingFlopsPerToken): 6 × matrix
    # parameters (12·C² per layer, the head's V·C) + attention's 12·L·C·T.
    flops_per_token = 6 * (L * 12 * C * C + V * C) + 12 * L * C * T
    name = torch.cuda.get_device_name()
    print(f"device: {name}; PyTorch {torch.__version__}; model: params={n_params}; B={B} T={T} "
          f"bf16 autocast, {'eager' if args.no_compile else 'torch.compile'}, SDPA, fused AdamW")
    g = torch.Generator(device=dev).manual_seed(1)
    total, warmup = 0.0, 3
    for i in range(warmup + args.steps):
        x = torch.randint(0, 50257, (B, T), device=dev, generator=g)
        y = torch.randint(0, 50257, (B, T), device=dev, generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= warmup:
            total += dt
            print(f"step {i - warmup + 1}: loss {loss.item():.4f}  {dt * 1e3:.1f} ms  "
                  f"{B * T / dt:.0f} tok/s")
    tok_s = args.steps * B * T / total
    peak = peak_bf16_flops(name)
    mfu = f"{100 * tok_s * flops_per_token / peak:.1f}%" if peak else "n/a"
    print(f"mean: {total / args.steps * 1e3:.1f} ms/step  {tok_s:.0f} tokens/s  "
          f"{tok_s * flops_per_token / 1e12:.1f} TFLOP/s  MFU {mfu}  peak memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
