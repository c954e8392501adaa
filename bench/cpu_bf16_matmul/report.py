#!/usr/bin/env python3
"""The summary of bench/cpu_bf16_matmul/run.sh: per variant, tokens/s (median over rounds of each
round's tokens per step / median step time after the skipped steps), the peak RSS and the held-out
loss train_gpt printed; then the ratios, paired within each round.

    report.py DIR --skip K --rounds R
Standard library only.
"""
import argparse
import importlib.util
import os
import re
import statistics
import sys

VARIANTS = (
    ("ours_fp32mm", "fallback GEMM path, the engine's fp32 products"),
    ("aten_bf16mm", "fallback GEMM path, LibTorch's bf16-accumulating GEMM"),
    ("onednn", "this CPU's own bf16 path"),
    ("fp32", "fp32 training"),
)
RATIOS = (
    ("ours_fp32mm", "aten_bf16mm", "fp32 products / LibTorch's bf16 GEMM (tokens/s)"),
    ("ours_fp32mm", "fp32", "bf16 with fp32 products / fp32 training (tokens/s)"),
    ("ours_fp32mm", "onednn", "fallback path with fp32 products / this CPU's own path (tokens/s)"),
)


def _load():
    """bench/gpt_ddp/report.py's metrics reader, loaded by path (same file name as this one)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt_ddp", "report.py")
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location("gpt_ddp_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load


def held_out(log_path):
    with open(log_path) as f:
        found = re.findall(r"held-out loss ([0-9.]+) -> ([0-9.]+)", f.read())
    return found[-1] if found else ("?", "?")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--skip", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    load = _load()
    runs = {v: [load(os.path.join(args.dir, f"round{r}_{v}.jsonl"), args.skip)
                for r in range(1, args.rounds + 1)] for v, _ in VARIANTS}
    print("\n| run | tokens/s median (min-max) | peak RSS MiB, largest rank | held-out loss (round 1) |")
    print("|---|---|---|---|")
    for v, label in VARIANTS:
        tps = [m["tps"] for m in runs[v]]
        rss = statistics.median(max(m["peak_rss"]) for m in runs[v]) / 2**20
        before, after = held_out(os.path.join(args.dir, f"round1_{v}.log"))
        print(f"| {v}: {label} | {statistics.median(tps):.0f} ({min(tps):.0f}-{max(tps):.0f}) "
              f"| {rss:.0f} | {before} -> {after} |")
    print()
    for v, _ in VARIANTS:
        tps = [m["tps"] for m in runs[v]]
        print(f"RESULT {v} tokens_per_s median={statistics.median(tps):.4g} "
              f"min={min(tps):.4g} max={max(tps):.4g} n={len(tps)}")
    for num, den, label in RATIOS:
        ratios = [a["tps"] / b["tps"] for a, b in zip(runs[num], runs[den])]
        print(f"RATIO {label}: median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
