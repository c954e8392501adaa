#!/usr/bin/env python3
"""Turns the metrics files of bench/zero_stages/run.sh into RESULT lines and the summary tables.

    report.py round DIR R --skip K    # RESULT lines of round R (DIR/roundR_<variant>.jsonl)
    report.py summary DIR --skip K    # tables over every complete round in DIR
Each metrics file is rank 0's JSONL, one object per optimizer step, as train_gpt --metrics_file,
bench/gpt_ddp/gpt_ddp.py and bench/common/deepspeed_train_gpt.py write it (all take the peak RSS
of each rank from VmHWM).
tokens/s = tokens per step / median step time over the steps after the first K; the peak RSS of
a run is each rank's high-water mark at the last step, and "max" is the largest over the ranks.
Standard library only.
"""
import argparse
import glob
import importlib.util
import os
import re
import statistics
import sys


def _gpt_ddp_report():
    """bench/gpt_ddp/report.py, loaded by path: it has the same file name as this script."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt_ddp", "report.py")
    sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("gpt_ddp_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _gpt_ddp_report()
fmt_range, load, result = _shared.fmt_range, _shared.load, _shared.result

VARIANTS = (
    ("ours0", "ours: train_gpt, ZeRO-0"),
    ("ours1", "ours: train_gpt, ZeRO-1"),
    ("ours2", "ours: train_gpt, ZeRO-2"),
    ("ours3", "ours: train_gpt, ZeRO-3"),
    ("ddp", "peer: PyTorch DDP + AdamW"),
    ("zero_ro", "peer: DDP + ZeroRedundancyOptimizer(AdamW)"),
    ("ds0", "peer: DeepSpeed, ZeRO-0"),
    ("ds1", "peer: DeepSpeed, ZeRO-1"),
    ("ds2", "peer: DeepSpeed, ZeRO-2"),
    ("ds3", "peer: DeepSpeed, ZeRO-3"),
)
# (numerator, denominator, label): paired within a round.
RATIOS = (
    ("ours0", "ddp", "ours ZeRO-0 / DDP"),
    ("ours1", "ddp", "ours ZeRO-1 / DDP"),
    ("ours2", "ddp", "ours ZeRO-2 / DDP"),
    ("ours1", "zero_ro", "ours ZeRO-1 / ZeroRedundancyOptimizer"),
    ("ours0", "ds0", "ours ZeRO-0 / DeepSpeed ZeRO-0"),
    ("ours1", "ds1", "ours ZeRO-1 / DeepSpeed ZeRO-1"),
    ("ours2", "ds2", "ours ZeRO-2 / DeepSpeed ZeRO-2"),
    ("ours3", "ds3", "ours ZeRO-3 / DeepSpeed ZeRO-3"),
    ("zero_ro", "ddp", "ZeroRedundancyOptimizer / DDP (the peer's own stage-1 cost)"),
    ("ours1", "ours0", "ours ZeRO-1 / ours ZeRO-0"),
    ("ours2", "ours0", "ours ZeRO-2 / ours ZeRO-0"),
    ("ours3", "ours0", "ours ZeRO-3 / ours ZeRO-0"),
)
MIB = 1048576.0


def load_round(out_dir, r, skip):
    """{variant: metrics} for round r, or None when a variant that round 1 ran is missing (run.sh
    runs a subset with VARIANTS=..., or without DeepSpeed)."""
    runs = {}
    for v, _ in VARIANTS:
        path = os.path.join(out_dir, f"round{r}_{v}.jsonl")
        if not os.path.exists(path):
            if not os.path.exists(os.path.join(out_dir, f"round1_{v}.jsonl")):
                continue
            return None
        runs[v] = load(path, skip)
        runs[v]["peak_max"] = max(runs[v]["peak_rss"])
    return runs


def report_round(args):
    runs = load_round(args.dir, args.round, args.skip)
    if runs is None:
        raise SystemExit(f"report: round {args.round} is incomplete in {args.dir}")
    for v in runs:
        m = runs[v]
        t = m["tokens_per_step"]
        result(f"zero_stages.{v}.tokens_per_s", m["tps"], t / m["step_max"], t / m["step_min"], m["n"],
               "tokens/s")
        rss = [b / MIB for b in m["peak_rss"]]
        result(f"zero_stages.{v}.peak_rss", max(rss), min(rss), max(rss), len(rss), "MiB")
    for num, den, _ in ratios_of(runs):
        ratio = runs[num]["tps"] / runs[den]["tps"]
        result(f"zero_stages.ratio_{num}_over_{den}", ratio, ratio, ratio, 1, "x")
    check_losses(runs, f"round {args.round}")


def ratios_of(runs):
    return [(num, den, label) for num, den, label in RATIOS if num in runs and den in runs]


def check_losses(runs, where):
    first = {v: runs[v]["first_loss"] for v in runs}
    print(f"INFO {where}: step-1 loss " + ", ".join(f"{v} {l:.4f}" for v, l in first.items()) +
          "; last-step loss " + ", ".join(f"{v} {runs[v]['last_loss']:.4f}" for v in runs))
    spread = max(first.values()) - min(first.values())
    if spread > 1e-5:
        print(f"WARN {where}: step-1 losses differ by {spread:.2e} (same weights and windows should "
              "agree to ~1e-5)")


def grep_logs(out_dir, pattern):
    """Lines matching pattern in the first round's logs, variant by variant."""
    lines = []
    for v, _ in VARIANTS:
        path = os.path.join(out_dir, f"round1_{v}.log")
        if os.path.exists(path):
            with open(path) as f:
                lines += [f"  [{v}] {line.rstrip()}" for line in f if re.search(pattern, line)]
    return lines


def report_summary(args):
    rounds = sorted({int(m.group(1)) for p in glob.glob(os.path.join(args.dir, "round*_*.jsonl"))
                     if (m := re.search(r"round(\d+)_", os.path.basename(p)))})
    data = [d for d in (load_round(args.dir, r, args.skip) for r in rounds) if d is not None]
    if not data:
        raise SystemExit(f"report: no complete round in {args.dir}")
    n = len(data)
    first = next(iter(data[0].values()))
    print()
    print(f"SUMMARY zero_stages: {n} round(s), {first['steps']} steps each, {first['tokens_per_step']} "
          f"tokens per step (2 ranks); per run the median step time over steps {args.skip + 1}.."
          f"{first['steps']}; values are the median over rounds (min–max)")
    print()
    print("| side | tokens/s | step time (ms) | peak RSS, max over ranks (MiB) | "
          "peak RSS rank 0 / rank 1 (MiB) | loss step 1 → last |")
    print("|---|---|---|---|---|---|")
    for v, label in VARIANTS:
        if v not in data[0]:
            continue
        tps = [d[v]["tps"] for d in data]
        ms = [d[v]["step_med"] * 1000 for d in data]
        peak = [d[v]["peak_max"] / MIB for d in data]
        nranks = len(data[0][v]["peak_rss"])
        per_rank = " / ".join(fmt_range([d[v]["peak_rss"][k] / MIB for d in data], "{:.0f}")
                              for k in range(nranks))
        loss = f"{data[0][v]['first_loss']:.4f} → {data[0][v]['last_loss']:.4f}"
        print(f"| {label} | {fmt_range(tps, '{:,.0f}')} | {fmt_range(ms, '{:.0f}')} | "
              f"{fmt_range(peak, '{:.0f}')} | {per_rank} | {loss} |")
    print()
    print("Ratios, paired within each round: median (min–max) over rounds")
    print()
    print("| ratio | tokens/s | peak RSS, max over ranks |")
    print("|---|---|---|")
    ratio_values = {}
    for num, den, label in ratios_of(data[0]):
        tps = [d[num]["tps"] / d[den]["tps"] for d in data]
        mem = [d[num]["peak_max"] / d[den]["peak_max"] for d in data]
        ratio_values[(num, den)] = tps
        print(f"| {label} | {fmt_range(tps, '{:.3f}')} | {fmt_range(mem, '{:.3f}')} |")
    print()
    check_losses(data[0], "round 1")

    print()
    print("Engine memory reports (rank 0 logs them; the PyTorch peers' lines come from gpt_ddp.py):")
    for line in grep_logs(args.dir, r"memory after (initialization|step 1)"):
        print(line)

    # Both sides must measure the peak the same way: the peers record ru_maxrss beside VmHWM.
    diffs = [abs(a - b) for d in data for v in d if d[v]["ru_maxrss"]
             for a, b in zip(d[v]["peak_rss"], d[v]["ru_maxrss"])]
    print()
    if diffs:
        print(f"INFO peak RSS: VmHWM on both sides; the peers' ru_maxrss differs from their VmHWM by "
              f"at most {max(diffs) / MIB:.2f} MiB")
    noise = {}
    for log in glob.glob(os.path.join(args.dir, "round*_*.log")):
        with open(log) as f:
            for m in re.finditer(r"^NOISE zero_stages\.(\w+)\.round\d+ foreign_cores=([\d.]+)", f.read(), re.M):
                noise.setdefault(m.group(1), []).append(float(m.group(2)))
    if noise:
        print("INFO other processes used (cores, NOISE lines; above ~0.3 the figures are depressed): " +
              "; ".join(f"{v} {fmt_range(noise[v], '{:.2f}')}" for v in data[0] if v in noise))
    redone = sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.dir, "round*_*.log.noisy*")))
    print(f"INFO runs redone because other processes disturbed them: {len(redone)}" +
          (f" ({', '.join(redone)})" if redone else ""))
    load_file = os.path.join(args.dir, "load.txt")
    if os.path.exists(load_file):
        with open(load_file) as f:
            print("INFO load averages: " + "; ".join(line.strip() for line in f if line.strip()))
    print()
    for v in data[0]:
        tps = [d[v]["tps"] for d in data]
        result(f"zero_stages.summary.{v}.tokens_per_s", statistics.median(tps), min(tps), max(tps), n,
               "tokens/s")
        peak = [d[v]["peak_max"] / MIB for d in data]
        result(f"zero_stages.summary.{v}.peak_rss_max", statistics.median(peak), min(peak), max(peak), n,
               "MiB")
    for (num, den), tps in ratio_values.items():
        result(f"zero_stages.summary.ratio_{num}_over_{den}", statistics.median(tps), min(tps), max(tps),
               n, "x")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("round")
    r.add_argument("dir")
    r.add_argument("round", type=int)
    r.add_argument("--skip", type=int, default=3)
    s = sub.add_parser("summary")
    s.add_argument("dir")
    s.add_argument("--skip", type=int, default=3)
    args = p.parse_args()
    (report_round if args.cmd == "round" else report_summary)(args)


if __name__ == "__main__":
    sys.exit(main())
