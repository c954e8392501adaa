#!/usr/bin/env python3
"""Summarizes train_gpt metrics files of one setting: bytes sent per step by rank 0 (warm-up
steps, compressed steps, mean), median tokens/s, final loss, and the loss curves side by side
as a PNG (gnuplot). Arguments: metrics-file prefixes without ".jsonl" (their last path part
after the setting is the optimizer's name)."""
import argparse
import json
import statistics
import subprocess


def rows_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", required=True)
    ap.add_argument("--freeze", type=int, required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    print(f"-- {a.title}")
    print(f"{'optimizer':<12} {'bytes/step warm-up':>19} {'bytes/step after':>17} "
          f"{'bytes/step mean':>16} {'tokens/s':>10} {'tokens/s after':>15} {'final loss':>11}")
    base = None
    curves = []
    for prefix in a.runs:
        name = prefix.rsplit("_", 1)[-1]
        rows = rows_of(prefix + ".jsonl")
        warm = [r["comm_bytes"] for r in rows if 1 < r["step"] <= a.freeze]
        after = [r["comm_bytes"] for r in rows if r["step"] > a.freeze + 1]
        mean = statistics.mean(r["comm_bytes"] for r in rows)
        tps = statistics.median(r["tokens_per_s"] for r in rows[1:])
        tps_after = statistics.median(r["tokens_per_s"] for r in rows if r["step"] > a.freeze + 1)
        final = statistics.mean(r["loss"] for r in rows[-5:])
        if base is None:
            base = (mean, tps_after)
        print(f"{name:<12} {statistics.median(warm):>19.0f} {statistics.median(after):>17.0f} "
              f"{mean:>16.0f} {tps:>10.0f} {tps_after:>15.0f} {final:>11.4f}   bytes x{base[0] / mean:.1f} "
              f"less, tokens/s after the freeze x{tps_after / base[1]:.2f}")
        data = prefix + ".dat"
        with open(data, "w") as f:
            for r in rows:
                f.write(f"{r['step']} {r['loss']}\n")
        curves.append((data, name))
    plot = ", ".join(f"'{d}' using 1:2 with lines title '{n}'" for d, n in curves)
    script = (f"set terminal pngcairo size 900,500; set output '{a.png}'; "
              f"set title '{a.title}: training loss'; set xlabel 'step'; set ylabel 'loss'; "
              f"set arrow from {a.freeze},graph 0 to {a.freeze},graph 1 nohead dt 2; plot {plot}")
    try:
        subprocess.run(["gnuplot", "-e", script], check=True)
        print(f"loss curves: {a.png}")
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no PNG ({e}); install gnuplot")


if __name__ == "__main__":
    main()
