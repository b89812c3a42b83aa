#!/usr/bin/env python3
"""The k-pool pooling written as PyTorch eager operations, timed on the GPU.

The baseline KPool's CUDA figures are compared with: the same pools
(docs/pools.md: per-channel softmax over gate + ape, weighting the keys) for a
fresh prefill of TOKENS tokens, D=128, K=4, bf16, as a serving engine would
write it without a custom kernel.

    python3 torch_pooling.py [--tokens 65536] [--batch 1] [--out torch.json]

Prints and writes {"tokens", "batch", "seconds", "gbps", "bytes"}; bytes
counts the same traffic as kpool_perf's compress (keys and gates read,
pooled keys written), so GB/s compare directly.
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--kpool", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--out", default="torch_pooling.json")
    a = p.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_pooling: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_pooling: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    K, D = a.kpool, a.head_dim
    n = a.batch * a.tokens
    g = torch.Generator(device=dev).manual_seed(0)
    key = (torch.rand(n, D, device=dev, generator=g) * 4 - 2).to(torch.bfloat16)
    gate = (torch.rand(n, D, device=dev, generator=g) * 8 - 4).to(torch.bfloat16)
    ape = torch.rand(K, D, device=dev, generator=g) - 0.5

    def pool():
        # [pools, K, D]: whole pools of this call's tokens, f32 math,
        # max-subtracted softmax over the K members per channel.
        k = key.view(-1, K, D).float()
        logits = gate.view(-1, K, D).float() + ape
        w = torch.softmax(logits, dim=1)
        return (w * k).sum(dim=1).to(torch.bfloat16)

    for _ in range(5):
        pool()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.runs):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        pool()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    sec = times[len(times) // 2]
    bytes_ = 2 * n * D * 2 + (n // K) * D * 2
    res = {"tokens": a.tokens, "batch": a.batch, "seconds": sec,
           "gbps": bytes_ / sec / 1e9, "bytes": bytes_,
           "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    print(json.dumps(res))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
