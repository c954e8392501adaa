#!/usr/bin/env bash
# data_efficiency.data_sampling against DeepSpeed 0.15.4 (.venv-deepspeed, made here if missing):
# the data analyzer over N samples of one integer metric (1000 values; one worker), then the
# curriculum sampler drawing B global batches of G samples from its files, the difficulty
# (value-based, fixed_linear from 100 to 999 over B/2 steps) admitting a new cluster at every
# step of the first half. Rounds interleave ours and DeepSpeed's; medians and ratios are
# printed. Builds nothing (build/bin/data_sampling_bench comes with scripts/build.sh).
# Env: ROUNDS (3), N (200000), G (256), B (200), DS_VENV (.venv-deepspeed), OUT_DIR (a new /tmp
#      directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
N=${N:-200000}
G=${G:-256}
B=${B:-200}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed}
ours=build/bin/data_sampling_bench
die() { echo "data_sampling bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
bash scripts/setup_deepspeed_peer.sh "$DS_VENV" >/dev/null ||
  die "scripts/setup_deepspeed_peer.sh failed"
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo DS_ACCELERATOR=cpu
out=${OUT_DIR:-$(mktemp -d /tmp/data_sampling_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO data_sampling bench: rounds=$ROUNDS N=$N G=$G B=$B out=$out" \
  "load=$(cut -d' ' -f1-3 /proc/loadavg)"

# The data_efficiency section both sides read (each points it at its own files).
cat > "$out/config.json" <<EOF
{"seed": 1234, "data_sampling": {"enabled": true, "num_epochs": 1000,
  "curriculum_learning": {"enabled": true, "data_cluster_path": "",
    "curriculum_metrics": {"m": {"index_to_sample_path": "", "index_to_metric_path": "",
      "difficulty_type": "value", "clustering_type": "schedule_based",
      "min_difficulty": 100, "max_difficulty": 999, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": $((B / 2)), "difficulty_step": 1}}}}}}
EOF

for ((r = 1; r <= ROUNDS; r++)); do
  for side in ours deepspeed; do
    work="$out/round$r-$side"
    rm -rf "$work" && mkdir -p "$work" && cp "$out/config.json" "$work/"
    if [ "$side" = ours ]; then
      "$ours" "$work" "$N" "$G" "$B" > "$work/log" 2>&1 || die "ours failed; see $work/log"
    else
      "$DS_VENV/bin/python" bench/data_sampling/deepspeed_data_sampling.py "$work" "$N" "$G" \
        "$B" $((29600 + RANDOM % 300)) > "$work/log" 2>&1 ||
        die "DeepSpeed failed; see $work/log"
    fi
    line=$(grep '^analyze_s=' "$work/log") || die "no result line in $work/log"
    echo "$side $line" >> "$out/results.txt"
    echo "INFO round $r $side: $line"
  done
done

/usr/bin/python3 - "$out/results.txt" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, *fields = line.split()
    values = dict(f.split("=") for f in fields)
    for key in ("analyze_s", "sample_ms_per_batch"):
        rows.setdefault((side, key), []).append(float(values[key]))
for (side, key), v in sorted(rows.items()):
    print(f"RESULT {side}_{key} median={statistics.median(v):.4f} min={min(v):.4f} "
          f"max={max(v):.4f} n={len(v)} unit={'s' if key == 'analyze_s' else 'ms'}")
print("| measure | ours | DeepSpeed 0.15.4 | DeepSpeed / ours |")
print("| --- | --- | --- | --- |")
for key, what in (("analyze_s", "analysis (s)"), ("sample_ms_per_batch", "sampler (ms per batch)")):
    o = statistics.median(rows[("ours", key)])
    d = statistics.median(rows[("deepspeed", key)])
    print(f"| {what} | {o:.4f} | {d:.4f} | {d / o:.1f}x |")
PYEOF
