#!/usr/bin/env python3
"""Turns the metrics files of bench/gpt_ddp/run.sh into RESULT lines and the summary table.

    report.py round R OURS.jsonl PEER.jsonl --skip K   # RESULT lines of one round
    report.py summary DIR --skip K                     # table over DIR/round*_{ours,peer}.jsonl
Each metrics file is rank 0's JSONL (one object per optimizer step: step, step_time_s, loss,
rss_bytes and peak_rss_bytes (VmHWM) per rank, ...), as train_gpt --metrics_file and gpt_ddp.py
write it. tokens/s = tokens per step / median step time over the steps after the first K.
Standard library only.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

SIDES = (("ours", "train_gpt ZeRO-0"), ("peer", "PyTorch DDP gloo"))
MIB = 1048576.0


def load(path, skip):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) <= skip:
        raise SystemExit(f"report: {path}: {len(rows)} steps; need more than the {skip} skipped")
    timed = [r["step_time_s"] for r in rows[skip:]]
    tokens_per_step = rows[0]["tokens"]  # cumulative tokens after step 1
    last = rows[-1]
    return {
        "steps": len(rows),
        "n": len(timed),
        "step_med": statistics.median(timed),
        "step_min": min(timed),
        "step_max": max(timed),
        "tokens_per_step": tokens_per_step,
        "tps": tokens_per_step / statistics.median(timed),
        "first_loss": rows[0]["loss"],
        "last_loss": last["loss"],
        "peak_rss": last["peak_rss_bytes"],
        "ru_maxrss": last.get("ru_maxrss_bytes"),  # the peer's cross-check of its VmHWM
    }


def result(name, med, lo, hi, n, unit):
    print(f"RESULT {name} median={med:.4g} min={lo:.4g} max={hi:.4g} n={n} unit={unit}")


def report_round(args):
    runs = {side: load(path, args.skip) for side, path in zip(("ours", "peer"), (args.ours, args.peer))}
    for side, _ in SIDES:
        m = runs[side]
        t = m["tokens_per_step"]
        result(f"gpt_ddp.{side}.tokens_per_s", m["tps"], t / m["step_max"], t / m["step_min"], m["n"], "tokens/s")
        result(f"gpt_ddp.{side}.step_time", m["step_med"], m["step_min"], m["step_max"], m["n"], "s")
        rss = [b / MIB for b in m["peak_rss"]]
        result(f"gpt_ddp.{side}.peak_rss", statistics.median(rss), min(rss), max(rss), len(rss), "MiB")
    ratio = runs["ours"]["tps"] / runs["peer"]["tps"]
    result("gpt_ddp.ratio_ours_over_peer", ratio, ratio, ratio, 1, "x")
    o, p = runs["ours"], runs["peer"]
    print(f"INFO round {args.round}: step-1 loss ours {o['first_loss']:.4f} peer {p['first_loss']:.4f}; "
          f"step-{o['steps']} loss ours {o['last_loss']:.4f} peer {p['last_loss']:.4f}")
    if abs(o["first_loss"] - p["first_loss"]) > 1e-5:
        print(f"WARN round {args.round}: step-1 losses differ by {abs(o['first_loss'] - p['first_loss']):.2e} "
              "(same weights and windows should agree to ~1e-5)")


def fmt_range(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def report_summary(args):
    rounds = sorted(int(re.search(r"round(\d+)_ours", p).group(1))
                    for p in glob.glob(os.path.join(args.dir, "round*_ours.jsonl")))
    data = []
    for r in rounds:
        paths = [os.path.join(args.dir, f"round{r}_{s}.jsonl") for s, _ in SIDES]
        if all(os.path.exists(p) for p in paths):
            data.append({s: load(p, args.skip) for (s, _), p in zip(SIDES, paths)})
    if not data:
        raise SystemExit(f"report: no complete round in {args.dir}")
    n = len(data)
    ratios = [d["ours"]["tps"] / d["peer"]["tps"] for d in data]
    first = data[0]["ours"]
    print()
    print(f"SUMMARY gpt_ddp: {n} round(s), {first['steps']} steps each, {first['tokens_per_step']} tokens "
          f"per step (2 ranks); per run the median step time over steps {args.skip + 1}..{first['steps']}; "
          "values are the median over rounds (min–max)")
    print()
    print("| side | tokens/s | step time (ms) | peak RSS per rank (MiB) | loss step 1 → last |")
    print("|---|---|---|---|---|")
    for side, label in SIDES:
        tps = [d[side]["tps"] for d in data]
        ms = [d[side]["step_med"] * 1000 for d in data]
        nranks = len(data[0][side]["peak_rss"])
        rss = " / ".join(fmt_range([d[side]["peak_rss"][k] / MIB for d in data], "{:.0f}")
                         for k in range(nranks))
        loss = f"{data[0][side]['first_loss']:.4f} → {data[0][side]['last_loss']:.4f}"
        print(f"| {side} ({label}) | {fmt_range(tps, '{:,.0f}')} | {fmt_range(ms, '{:.0f}')} | {rss} | {loss} |")
    print()
    print(f"ratio ours/peer (tokens/s, paired per round): median {fmt_range(ratios, '{:.3f}')}; "
          f"per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    noise = []
    for log in glob.glob(os.path.join(args.dir, "round*_*.log")):
        with open(log) as f:
            noise += [float(m) for m in re.findall(r"^NOISE \S+ foreign_cores=([\d.]+)", f.read(), re.M)]
    if noise:
        print(f"other processes used {fmt_range(noise, '{:.2f}')} cores during the {len(noise)} runs "
              "(NOISE lines); above ~0.3 the absolute figures are depressed and the ratio is noisier")
    print()
    for side, _ in SIDES:
        tps = [d[side]["tps"] for d in data]
        result(f"gpt_ddp.summary.{side}.tokens_per_s", statistics.median(tps), min(tps), max(tps), n, "tokens/s")
    result("gpt_ddp.summary.ratio_ours_over_peer", statistics.median(ratios), min(ratios), max(ratios), n, "x")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("round")
    r.add_argument("round", type=int)
    r.add_argument("ours")
    r.add_argument("peer")
    r.add_argument("--skip", type=int, default=3)
    s = sub.add_parser("summary")
    s.add_argument("dir")
    s.add_argument("--skip", type=int, default=3)
    args = p.parse_args()
    (report_round if args.cmd == "round" else report_summary)(args)


if __name__ == "__main__":
    sys.exit(main())
