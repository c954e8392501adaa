#!/usr/bin/env bash
# Causal self-attention, forward + backward, at growing sequence lengths: our block-sparse
# attention (DeepSpeed's default fixed pattern, unidirectional, blocks of BLOCK tokens) against
# dense attention, ours (LibTorch) and PyTorch's in Python (Debian's python3-torch, the same
# LibTorch build). DeepSpeed's own sparse attention is not a peer here: its kernels are Triton
# kernels for CUDA GPUs (and fp16 only). Each process runs ITERS timed passes after a warm-up;
# rounds interleave the three; medians of the rounds, ratios and each process's resident peak
# are printed. Builds nothing (build/bin/sparse_attention_bench comes with scripts/build.sh).
# Env: ROUNDS (3), ITERS (3), LENGTHS ("1024 2048 4096"), H (8), D (64), BLOCK (64),
#      THREADS (2)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-3}
LENGTHS=${LENGTHS:-"1024 2048 4096"}
H=${H:-8}
D=${D:-64}
BLOCK=${BLOCK:-64}
THREADS=${THREADS:-2}
ours=build/bin/sparse_attention_bench
die() { echo "sparse attention bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  die "python3-torch is missing (apt-get install python3-torch)"
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=$THREADS
out=$(mktemp -d /tmp/sparse_attention_bench.XXXXXX)
echo "INFO sparse attention bench: rounds=$ROUNDS iters=$ITERS lengths=($LENGTHS) H=$H D=$D" \
  "block=$BLOCK threads=$THREADS load=$(cut -d' ' -f1-3 /proc/loadavg)"

for ((r = 1; r <= ROUNDS; r++)); do
  for T in $LENGTHS; do
    s=$("$ours" sparse "$T" "$H" "$D" "$BLOCK" "$ITERS") || die "ours (sparse) failed"
    d=$("$ours" dense "$T" "$H" "$D" "$BLOCK" "$ITERS") || die "ours (dense) failed"
    p=$(/usr/bin/python3 bench/sparse_attention/torch_attention.py "$T" "$H" "$D" "$ITERS") ||
      die "PyTorch failed"
    echo "sparse $T $s" >> "$out/results.txt"
    echo "dense $T $d" >> "$out/results.txt"
    echo "pytorch $T $p" >> "$out/results.txt"
    echo "INFO round $r T=$T: sparse $s | dense $d | PyTorch $p"
  done
done

/usr/bin/python3 - "$out/results.txt" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, T, *fields = line.split()
    f = dict(x.split("=") for x in fields)
    rows.setdefault((side, int(T)), []).append(f)
med = lambda side, T, key: statistics.median(float(f[key]) for f in rows[(side, T)])
print("| T | blocks kept | sparse (ms) | dense, ours (ms) | dense, PyTorch (ms) "
      "| PyTorch / sparse | peak MB sparse / dense / PyTorch |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for T in sorted({T for _, T in rows}):
    s, d, p = (med(x, T, "step_ms") for x in ("sparse", "dense", "pytorch"))
    kept = med("sparse", T, "kept")
    mem = " / ".join(f"{med(x, T, 'peak_mb'):.0f}" for x in ("sparse", "dense", "pytorch"))
    print(f"| {T} | {kept:.1%} | {s:.1f} | {d:.1f} | {p:.1f} | {p / s:.2f}x | {mem} |")
PYEOF
