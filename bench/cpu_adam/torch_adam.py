#!/usr/bin/env python3
"""Python's torch.optim.Adam on one flat fp32 tensor: the peer a Python user would run.

    torch_adam.py [--sizes 10,100] [--rounds 3] [--steps 3] [--warmup 1] [--threads default,1,2]

For each thread count (`default` is torch's own choice, read at start-up), interleaved round by
round, prints the same ROUND / RESULT lines as cpu_adam_bench (bench/cpu_adam/report.py reads
both):  RESULT torch_py_adam_t<T>.n<N>M median=<s/step> min=.. max=.. n=<rounds> unit=s/step ...
Run it with Debian's /usr/bin/python3 (python3-torch, the same LibTorch build the C++ side links).
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10,100", help="comma-separated, millions of parameters")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", default="default,1,2", help="comma-separated; 'default' = torch's")
    a = p.parse_args()

    default_threads = torch.get_num_threads()
    thread_counts = []
    for t in a.threads.split(","):
        t = default_threads if t == "default" else int(t)
        if t not in thread_counts:
            thread_counts.append(t)
    print(f"INFO torch_adam.py: torch {torch.__version__} default_threads={default_threads} "
          f"threads={thread_counts} sizes={a.sizes} rounds={a.rounds} steps={a.steps} "
          f"warmup={a.warmup}", flush=True)

    for millions in (int(s) for s in a.sizes.split(",")):
        n = millions * 1_000_000
        # Same initial values and hyper-parameters as cpu_adam_bench (DeepSpeed's defaults).
        idx = torch.arange(n, dtype=torch.int64)
        param = (1e-3 * (idx % 2001 - 1000).to(torch.float32)).requires_grad_(True)
        param.grad = 1e-4 * (idx % 1999 - 999).to(torch.float32)
        del idx
        opt = torch.optim.Adam([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        round_medians = {t: [] for t in thread_counts}
        for r in range(a.rounds):
            for t in thread_counts:
                torch.set_num_threads(t)
                for _ in range(a.warmup):
                    opt.step()
                times = []
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    opt.step()
                    times.append(time.perf_counter() - t0)
                round_medians[t].append(statistics.median(times))
                print(f"ROUND torch_py_adam_t{t}.n{millions}M round={r} "
                      f"median={round_medians[t][-1]:.6f}", flush=True)
        for t, meds in round_medians.items():
            print(f"RESULT torch_py_adam_t{t}.n{millions}M median={statistics.median(meds):.6f} "
                  f"min={min(meds):.6f} max={max(meds):.6f} n={len(meds)} unit=s/step "
                  f"threads={t} bytes_per_elem=28 elems={n}", flush=True)
        del opt, param


if __name__ == "__main__":
    main()
