#!/usr/bin/env python3
"""Measures how steady this machine's compute speed is, with nothing of ours running.

    source bench/common/pin_openblas_core.sh   # the kernels the benches run (bench/README.md)
    /usr/bin/python3 bench/common/speed_probe.py [--seconds 60] [--interval 0.7] [--procs N]
Starts N single-threaded processes that each repeat a small training-like piece of work (a
[256, 768] x [768, 768] matmul and an element-wise pass over 4 MiB) and count the repetitions per
interval. Prints one `PROBE` line a process with its rates, then
`PROBE_SUMMARY median=.. min=.. p10=.. max=.. spread=..` (spread = 1 - p10 / median).

Why: a guest VM shares caches, memory bandwidth and the sibling hyperthreads of its cores with
other guests, and none of that shows in /proc/stat (steal stays 0) or in bench/common/cpumon.py.
On the 2-vCPU Intel guest of 2026-12-07 this probe's rate swung between ~100 and ~55-70 per
interval in phases of several seconds with steal at 0, the same phases train_gpt's steps show
(bench/README.md, zero_stages). A spread above ~0.1 means tokens/s figures from this machine
move by as much between runs, whatever is measured.
"""
import argparse
import multiprocessing
import os
import statistics
import time


def probe(seconds, interval, queue):
    import torch  # in the worker: each process sets its own thread count before any work

    torch.set_num_threads(1)
    a, b, v = torch.randn(256, 768), torch.randn(768, 768), torch.randn(1024 * 1024)
    rates = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, n = time.monotonic(), 0
        while time.monotonic() - start < interval:
            torch.mm(a, b)
            v.mul_(1.0001)
            n += 1
        rates.append(n / (time.monotonic() - start))
    queue.put(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=0.7)
    parser.add_argument("--procs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Without the pin, an OpenBLAS older than the CPU runs its SSE3 kernels (4x slower here).
    print(f"INFO OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')} "
          f"procs={args.procs}")
    queue = multiprocessing.get_context("spawn").Queue()
    workers = [multiprocessing.get_context("spawn").Process(
        target=probe, args=(args.seconds, args.interval, queue)) for _ in range(args.procs)]
    for w in workers:
        w.start()
    every = []
    for i in range(args.procs):
        rates = queue.get()
        every += rates
        print(f"PROBE {i} " + " ".join(f"{r:.0f}" for r in rates))
    for w in workers:
        w.join()
    every.sort()
    median, p10 = statistics.median(every), every[len(every) // 10]
    print(f"PROBE_SUMMARY median={median:.1f} min={every[0]:.1f} p10={p10:.1f} "
          f"max={every[-1]:.1f} spread={1 - p10 / median:.3f}")


if __name__ == "__main__":
    main()
