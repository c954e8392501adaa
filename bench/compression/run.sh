#!/usr/bin/env bash
# Training steps under compression_training against DeepSpeed 0.15.4's LinearLayer_Compress
# (.venv-deepspeed, made here if missing), both on Debian's LibTorch 1.13: a residual MLP stack
# (L blocks of D -> 4D -> D, TOKENS tokens a step), forward + backward + SGD, plain and with
# bench_config.json (8-bit weights in the forward, dynamic 8-bit activations, topk row
# pruning). Rounds interleave ours and DeepSpeed's; medians, ratios and each side's overhead
# of compression are printed, and the last losses of both sides (same seed, same weights).
# Builds nothing (build/bin/compression_bench comes with scripts/build.sh).
# Env: ROUNDS (3), STEPS (20), D (256), L (4), TOKENS (1024), THREADS (2),
#      DS_VENV (.venv-deepspeed)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
D=${D:-256}
L=${L:-4}
TOKENS=${TOKENS:-1024}
THREADS=${THREADS:-2}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed}
ours=build/bin/compression_bench
config=bench/compression/bench_config.json
die() { echo "compression bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
bash scripts/setup_deepspeed_peer.sh "$DS_VENV" >/dev/null ||
  die "scripts/setup_deepspeed_peer.sh failed"
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=$THREADS DS_ACCELERATOR=cpu
out=$(mktemp -d /tmp/compression_bench.XXXXXX)
echo "INFO compression bench: rounds=$ROUNDS steps=$STEPS D=$D L=$L tokens=$TOKENS" \
  "threads=$THREADS load=$(cut -d' ' -f1-3 /proc/loadavg)"

for ((r = 1; r <= ROUNDS; r++)); do
  for mode in plain compressed; do
    o=$("$ours" "$mode" "$config" "$STEPS" "$D" "$L" "$TOKENS" | grep '^step_ms=') ||
      die "ours failed"
    d=$("$DS_VENV/bin/python" bench/compression/deepspeed_compression.py "$mode" "$config" \
      "$STEPS" "$D" "$L" "$TOKENS" 2>/dev/null | grep '^step_ms=') || die "DeepSpeed failed"
    echo "ours $mode $o" >> "$out/results.txt"
    echo "deepspeed $mode $d" >> "$out/results.txt"
    echo "INFO round $r $mode: ours $o | DeepSpeed $d"
  done
done

/usr/bin/python3 - "$out/results.txt" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, mode, *fields = line.split()
    f = dict(x.split("=") for x in fields)
    rows.setdefault((side, mode), []).append((float(f["step_ms"]), float(f["loss"])))
med = {k: statistics.median(t for t, _ in v) for k, v in rows.items()}
print("| mode | ours (ms/step) | DeepSpeed 0.15.4 (ms/step) | DeepSpeed / ours |")
print("| --- | --- | --- | --- |")
for mode in ("plain", "compressed"):
    o, d = med[("ours", mode)], med[("deepspeed", mode)]
    print(f"| {mode} | {o:.1f} | {d:.1f} | {d / o:.2f}x |")
for side in ("ours", "deepspeed"):
    print(f"{side}: compression costs {med[(side, 'compressed')] / med[(side, 'plain')]:.2f}x "
          f"a plain step")
for mode in ("plain", "compressed"):
    lo, ld = rows[("ours", mode)][-1][1], rows[("deepspeed", mode)][-1][1]
    print(f"last loss ({mode}): ours {lo:.6f}, DeepSpeed {ld:.6f}")
PYEOF
