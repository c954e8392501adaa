#!/usr/bin/env python3
"""Merges the logs of cpu_adam_bench and torch_adam.py into one table with ratios.

    report.py LOG [LOG...]
Reads ROUND, RESULT and NOISE lines (see cpu_adam_bench.cpp). Ratios between two C++ variants
are paired: computed per round (the variants ran interleaved in one process) and summarised as
median (min-max). Ratios against Python (another process) divide the medians. Standard library
only.
"""
import re
import statistics
import sys
from collections import defaultdict

FIELD = re.compile(r"(\w+)=(\S+)")


def parse(paths):
    results, rounds, notes = {}, defaultdict(dict), []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                kind, _, rest = line.partition(" ")
                if kind in ("RESULT", "ROUND"):
                    key, _, fields = rest.partition(" ")
                    values = dict(FIELD.findall(fields))
                    if kind == "RESULT":
                        results[key] = values
                    else:
                        rounds[key][int(values["round"])] = float(values["median"])
                elif kind in ("NOISE", "INFO", "WARN"):
                    notes.append(line)
    return results, rounds, notes


def split_key(key):
    variant, _, size = key.rpartition(".n")
    return variant, int(size.rstrip("M"))


def paired_ratio(rounds, numerator, denominator):
    """Per-round ratio numerator_time / denominator_time: median, min, max."""
    a, b = rounds.get(numerator, {}), rounds.get(denominator, {})
    per_round = [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r] > 0]
    if not per_round:
        return None
    return statistics.median(per_round), min(per_round), max(per_round)


def fmt_ratio(r, scale=1.0, suffix="x"):
    if r is None:
        return "n/a"
    return f"{r[0] * scale:.2f}{suffix} ({r[1] * scale:.2f}-{r[2] * scale:.2f})"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    results, rounds, notes = parse(sys.argv[1:])
    for note in notes:
        if note.startswith(("NOISE", "WARN")):
            print(note)
    sizes = sorted({split_key(k)[1] for k in results})
    for size in sizes:
        rows = {split_key(k)[0]: v for k, v in results.items() if split_key(k)[1] == size}
        print(f"\n### {size}M fp32 parameters\n")
        print("| variant | threads | s/step median (min-max of round medians) | s per 1e9 params "
              "| GB/s (counted) |")
        print("|---|---|---|---|---|")
        for variant, v in rows.items():
            med, lo, hi = float(v["median"]), float(v["min"]), float(v["max"])
            elems, per_elem = int(v["elems"]), float(v["bytes_per_elem"])
            print(f"| {variant} | {v['threads']} | {med:.4f} ({lo:.4f}-{hi:.4f}) "
                  f"| {med / elems * 1e9:.3f} | {per_elem * elems / med / 1e9:.1f} |")

        paths = [p for p in ("cpu_adam_avx512", "cpu_adam_avx2", "cpu_adam_scalar") if p in rows]
        if not paths:
            continue
        best = paths[0]
        key = lambda variant: f"{variant}.n{size}M"  # noqa: E731
        print()
        for variant in sorted(rows):
            if variant.startswith("torch_cpp_adam"):
                r = paired_ratio(rounds, key(variant), key(best))
                print(f"- {best} speed-up over {variant} (paired per round): {fmt_ratio(r)}")
        for variant in sorted(rows):
            if variant.startswith("torch_py_adam"):
                ratio = float(rows[variant]["median"]) / float(rows[best]["median"])
                print(f"- {best} speed-up over {variant} (ratio of medians, separate process): "
                      f"{ratio:.2f}x")
        if "fused_loop" in rows:
            for path in paths + [p for p in rows if p.endswith("_bf16copy")]:
                r = paired_ratio(rounds, key("fused_loop"), key(path))
                if path.endswith("_bf16copy") and r is not None:  # it also writes 2 B/element
                    r = tuple(x * 30.0 / 28.0 for x in r)
                print(f"- {path} bandwidth as % of fused_loop's (paired per round): "
                      f"{fmt_ratio(r, 100.0, '%')}")
        for variant in sorted(rows):
            if variant.endswith("_clip_fused"):
                separate = variant.replace("_clip_fused", "_clip_pass")
                if separate in rows:
                    r = paired_ratio(rounds, key(separate), key(variant))
                    print(f"- clip coefficient in the update ({variant}) speed-up over a pass of "
                          f"its own ({separate}, paired per round): {fmt_ratio(r)}")
        # The targets: >= 8x torch::optim::Adam when both use the same threads (both
        # cores), and >= 90% of the fused loop's bandwidth.
        ours_threads = rows[best]["threads"]
        same_threads = f"torch_cpp_adam_t{ours_threads}"
        if same_threads in rows:
            r = paired_ratio(rounds, key(same_threads), key(best))
            print(f"- TARGET {best} >= 8x {same_threads} (same {ours_threads} threads): "
                  f"{'MET' if r and r[0] >= 8 else 'MISSED'} ({fmt_ratio(r)})")
        if "fused_loop" in rows:
            r = paired_ratio(rounds, key("fused_loop"), key(best))
            print(f"- TARGET {best} >= 90% of fused_loop bandwidth: "
                  f"{'MET' if r and r[0] >= 0.9 else 'MISSED'} ({fmt_ratio(r, 100.0, '%')})")
        if "triad" in rows:
            triad_gbs = 12.0 * int(rows["triad"]["elems"]) / float(rows["triad"]["median"]) / 1e9
            best_gbs = 28.0 * int(rows[best]["elems"]) / float(rows[best]["median"]) / 1e9
            print(f"- {best}: {best_gbs:.1f} GB/s counted vs triad {triad_gbs:.1f} GB/s counted "
                  f"(triad also moves 4 B/element of write-allocate that STREAM does not count)")


if __name__ == "__main__":
    main()
