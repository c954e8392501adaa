"""Medians over rounds of train_gpt / peer metrics files, for the bench scripts.

Usage: summarize_runs.py OUT ROUNDS SKIP KIND... [-- A/B:WHAT ...]
Reads OUT/<kind>_<round>.jsonl (one row per step) for every kind and round 1..ROUNDS, skips the
first SKIP steps of each, and prints RESULT lines (tokens/s, peak RSS per rank, bytes sent per
rank per step when recorded, last loss) and a RATIO line for each A/B:WHAT pair given after --.
"""
import json
import statistics
import sys


def rows(out, name):
    return [json.loads(line) for line in open(f"{out}/{name}.jsonl") if line.strip()]


def main():
    args = sys.argv[1:]
    pairs = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    out, rounds, skip, kinds = args[0], int(args[1]), int(args[2]), args[3:]
    res = {}
    for kind in kinds:
        tps, peak, comm, loss = [], [], [], []
        for r in range(1, rounds + 1):
            rs = rows(out, f"{kind}_{r}")
            tps.append(statistics.median(x["tokens_per_s"] for x in rs[skip:]))
            peak.append(max(rs[-1]["memory_bytes"]["peak_rss"]) / 2**20)
            if "comm_bytes" in rs[-1]:
                comm.append(statistics.median(x["comm_bytes"] for x in rs[skip:]) / 2**20)
            loss.append(rs[-1]["loss"])
        res[kind] = (statistics.median(tps), statistics.median(peak))
        print(f"RESULT {kind}_tokens_per_s median={res[kind][0]:.0f} min={min(tps):.0f} "
              f"max={max(tps):.0f} n={rounds} unit=tokens/s")
        print(f"RESULT {kind}_peak_rss_per_rank median={res[kind][1]:.0f} min={min(peak):.0f} "
              f"max={max(peak):.0f} unit=MiB")
        if comm:
            print(f"RESULT {kind}_comm_bytes_per_rank_per_step "
                  f"median={statistics.median(comm):.2f} unit=MiB")
        print(f"RESULT {kind}_last_loss median={statistics.median(loss):.4f}")
    for pair in pairs:
        ab, what = pair.split(":", 1)
        a, b = ab.split("/")
        if a in res and b in res:
            print(f"RATIO {a}/{b} tokens/s {res[a][0] / res[b][0]:.2f}, peak RSS per rank "
                  f"{res[a][1] / res[b][1]:.2f}  ({what})")


if __name__ == "__main__":
    main()
