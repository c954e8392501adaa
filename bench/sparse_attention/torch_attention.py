"""PyTorch's side of bench/sparse_attention: causal self-attention forward + backward over
[1, H, T, D] in Python on Debian's python3-torch (the LibTorch build ours links), written as
LibTorch's CPU path and the example GPT write it (q k^T scaled, masked above the diagonal,
softmax, times v). DeepSpeed's block-sparse kernels need Triton on a CUDA GPU, so on a CPU this
dense attention is what a Python user has.

Usage: torch_attention.py T [H D ITERS]; prints "step_ms=<median> peak_mb=<resident peak>
sum=<checksum>".
"""
import math
import resource
import statistics
import sys
import time

import torch


def main():
    T = int(sys.argv[1])
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    D = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    iters = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    times = []
    for i in range(iters + 1):
        start = time.perf_counter()
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        out = att @ v
        out.sum().backward()
        stop = time.perf_counter()
        checksum = out.sum().item()
        q.grad = k.grad = v.grad = None
        if i > 0:
            times.append((stop - start) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"step_ms={statistics.median(times):.2f} peak_mb={peak:.0f} sum={checksum:.6f}")


if __name__ == "__main__":
    main()
