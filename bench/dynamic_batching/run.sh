#!/usr/bin/env bash
# Dynamic batching's packing (batch_by_seqlens) against DeepSpeed 0.19.8's
# (.venv-deepspeed-torch2, made here if missing; 0.15.4 predates dynamic batching): N samples of
# lengths 1..59 packed into micro-batches of at most T tokens, 8 per batch, in each picking
# order. Rounds interleave ours and DeepSpeed's; both must pack alike (the checksum over every
# micro-batch's ids); medians and ratios are printed, then ours alone at N_BIG samples
# (DeepSpeed's packing grows with the cube of N, ours linearly). Builds nothing
# (build/bin/dynamic_batching_bench comes with scripts/build.sh).
# Env: ROUNDS (3), N (2000), N_BIG (1000000), T (256), DS_VENV (.venv-deepspeed-torch2)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
N=${N:-2000}
N_BIG=${N_BIG:-1000000}
T=${T:-256}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
ours=build/bin/dynamic_batching_bench
die() { echo "dynamic_batching bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
bash scripts/setup_deepspeed_peer.sh --torch2 "$DS_VENV" >/dev/null ||
  die "scripts/setup_deepspeed_peer.sh --torch2 failed"
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu
out=$(mktemp -d /tmp/dynamic_batching_bench.XXXXXX)
echo "INFO dynamic_batching bench: rounds=$ROUNDS N=$N T=$T" \
  "load=$(cut -d' ' -f1-3 /proc/loadavg)"

for ((r = 1; r <= ROUNDS; r++)); do
  for order in dataloader seqlen random; do
    o=$("$ours" "$N" "$T" "$order") || die "ours failed"
    d=$("$DS_VENV/bin/python" bench/dynamic_batching/deepspeed_dynamic_batching.py "$N" "$T" \
      "$order" 2>/dev/null | grep '^pack_s=') || die "DeepSpeed failed"
    [ "${o#* }" = "${d#* }" ] || die "$order: packed differently: ours '$o', DeepSpeed '$d'"
    echo "ours $order $o" >> "$out/results.txt"
    echo "deepspeed $order $d" >> "$out/results.txt"
    echo "INFO round $r $order: ours $o | DeepSpeed $d"
  done
done
big=$("$ours" "$N_BIG" "$T" random) || die "ours failed at N=$N_BIG"
echo "INFO ours at N=$N_BIG (random): $big"

/usr/bin/python3 - "$out/results.txt" "$N" "$N_BIG" "$big" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, order, *fields = line.split()
    rows.setdefault((side, order), []).append(float(dict(f.split("=") for f in fields)["pack_s"]))
print(f"| order ({sys.argv[2]} samples) | ours (ms) | DeepSpeed 0.19.8 (ms) | DeepSpeed / ours |")
print("| --- | --- | --- | --- |")
for order in ("dataloader", "seqlen", "random"):
    o = statistics.median(rows[("ours", order)]) * 1e3
    d = statistics.median(rows[("deepspeed", order)]) * 1e3
    print(f"| {order} | {o:.3f} | {d:.1f} | {d / o:.0f}x |")
big = dict(f.split("=") for f in sys.argv[4].split())
print(f"ours, {sys.argv[3]} samples (random): {float(big['pack_s']) * 1e3:.1f} ms, "
      f"{big['batches']} batches")
PYEOF
