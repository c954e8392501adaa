"""The Python side of bench/cross_entropy: forward + backward of a causal LM's loss from its last
hidden states h [N, D] and output projection W [V, D], both trained:
  pytorch            F.cross_entropy over (h @ W.T).float(), as Hugging Face's ForCausalLMLoss;
  deepspeed_chunked  DeepSpeed's chunked_cross_entropy over h @ W.T (its PyTorch backend: the
                     Triton one needs a CUDA GPU);
  deepspeed_fused    DeepSpeed's vocab_parallel_linear_cross_entropy(h, W) on one rank (the
                     LM head fused into the loss).
The DeepSpeed forms need DeepSpeed >= 0.19.8 (the project's .venv-deepspeed-torch2).

Usage: python_cross_entropy.py FORM N D V fp32|bf16 [ITERS]; prints "step_ms=<median>
step_peak_mb=<resident peak of a step above the memory before it> loss=<loss>".
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from resident_peak import reset_resident_peak, status_mib  # noqa: E402
import torch.nn.functional as F


def main():
    form = sys.argv[1]
    n, d, v = (int(x) for x in sys.argv[2:5])
    dtype = torch.bfloat16 if sys.argv[5] == "bf16" else torch.float32
    iters = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    if form == "pytorch":
        loss_fn = lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t)
    elif form == "deepspeed_chunked":
        from deepspeed.runtime.chunked_cross_entropy import chunked_cross_entropy
        loss_fn = lambda h, w, t: chunked_cross_entropy(h @ w.t(), t, backend="torch")
    elif form == "deepspeed_fused":
        from deepspeed.sequence.linear_cross_entropy import vocab_parallel_linear_cross_entropy
        loss_fn = lambda h, w, t: vocab_parallel_linear_cross_entropy(h, w, t)
    else:
        sys.exit(f"python_cross_entropy.py: unknown form {form}")
    torch.manual_seed(0)
    h = torch.randn(n, d).to(dtype).requires_grad_()
    w = (torch.randn(v, d) * 0.02).to(dtype).requires_grad_()
    t = torch.randint(v, (n, ))
    times, peak = [], 0.0
    for i in range(iters + 1):  # the first is a warm-up
        h.grad = w.grad = None
        before = status_mib("VmRSS")
        reset_resident_peak()
        start = time.perf_counter()
        loss = loss_fn(h, w, t)
        loss.backward()
        stop = time.perf_counter()
        peak = max(peak, status_mib("VmHWM") - before)
        if i > 0:
            times.append((stop - start) * 1e3)
    print(f"step_ms={statistics.median(times):.1f} step_peak_mb={peak:.0f} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
