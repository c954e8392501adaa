#!/usr/bin/env bash
# A causal LM's loss, forward + backward, from the last hidden states h [N, D] and the output
# projection W [V, D] (docs/cross_entropy.md): ours (chunked_cross_entropy, linear_cross_entropy)
# and plain LibTorch's cross_entropy over fp32 logits (cross_entropy_bench), PyTorch's in Python
# on the same LibTorch build (Debian's python3-torch), and DeepSpeed 0.19.8's chunked and fused
# losses with torch 2.11's cross_entropy beside them (.venv-deepspeed-torch2, made by
# scripts/setup_deepspeed_peer.sh; its wheel's own GEMM is faster than Debian's, so DeepSpeed's
# forms are compared with torch 2.11's cross_entropy, ours with LibTorch 1.13's). Each process
# runs ITERS timed steps after a warm-up; the forms run interleaved, ROUNDS rounds; medians of
# step time and of a step's resident peak above the memory before it (the memory the loss
# needs), and the median of each round's ratio to its torch's cross_entropy. Builds nothing
# (build/bin/cross_entropy_bench comes with scripts/build.sh).
# Env: N (2048 tokens), D (576), V (49152: SmolLM2-135M's head), DTYPES ("fp32 bf16"),
#      ROUNDS (3), ITERS (2), THREADS (2), DS_VENV (.venv-deepspeed-torch2; none leaves it out)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
N=${N:-2048}
D=${D:-576}
V=${V:-49152}
DTYPES=${DTYPES:-"fp32 bf16"}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-2}
THREADS=${THREADS:-2}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
ours=build/bin/cross_entropy_bench
die() { echo "cross_entropy bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  die "python3-torch is missing (apt-get install python3-torch)"
if [ "$DS_VENV" != none ] && [ ! -x "$DS_VENV/bin/python" ]; then
  bash scripts/setup_deepspeed_peer.sh --torch2 "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed (DS_VENV=none leaves DeepSpeed out)"
fi
# Pinned environment (bench/README.md): auto-detected OpenBLAS kernels; two threads whose idle
# pool does not spin against the other's.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE DS_ACCELERATOR=cpu
out=$(mktemp -d /tmp/cross_entropy_bench.XXXXXX)
echo "INFO cross_entropy bench: N=$N D=$D V=$V dtypes=($DTYPES) rounds=$ROUNDS iters=$ITERS" \
  "threads=$THREADS load=$(cut -d' ' -f1-3 /proc/loadavg)"

py=bench/cross_entropy/python_cross_entropy.py
for ((r = 1; r <= ROUNDS; r++)); do
  for dt in $DTYPES; do
    run() {  # NAME COMMAND...: one process, its result line recorded
      local name=$1 res
      shift
      res=$("$@" 2>"$out/stderr.txt" | tail -1) || die "$name failed: $(tail -3 "$out/stderr.txt")"
      echo "$name $dt $res" >> "$out/results.txt"
      echo "INFO round $r $dt $name: $res"
    }
    run libtorch "$ours" libtorch "$N" "$D" "$V" "$dt" "$ITERS"
    run chunked "$ours" chunked "$N" "$D" "$V" "$dt" "$ITERS"
    run fused "$ours" fused "$N" "$D" "$V" "$dt" "$ITERS"
    run pytorch /usr/bin/python3 "$py" pytorch "$N" "$D" "$V" "$dt" "$ITERS"
    if [ "$DS_VENV" != none ]; then
      for form in pytorch deepspeed_chunked deepspeed_fused; do
        run "torch2_$form" "$DS_VENV/bin/python" "$py" "$form" "$N" "$D" "$V" "$dt" "$ITERS"
      done
    fi
  done
done

/usr/bin/python3 - "$out/results.txt" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, dt, *fields = line.split()
    rows.setdefault((name, dt), []).append(dict(x.split("=") for x in fields))
med = lambda name, dt, key: statistics.median(float(f[key]) for f in rows[(name, dt)])
# Ratios within each round (the forms ran one after another), then their median.
ratio = lambda name, base, dt, key: statistics.median(
    float(a[key]) / float(b[key]) for a, b in zip(rows[(name, dt)], rows[(base, dt)]))
label = {
    "libtorch": "LibTorch 1.13 cross_entropy(logits.float())",
    "chunked": "ours chunked_cross_entropy",
    "fused": "ours linear_cross_entropy",
    "pytorch": "PyTorch 1.13 (Python) F.cross_entropy(logits.float())",
    "torch2_pytorch": "torch 2.11 (Python) F.cross_entropy(logits.float())",
    "torch2_deepspeed_chunked": "DeepSpeed 0.19.8 chunked_cross_entropy",
    "torch2_deepspeed_fused": "DeepSpeed 0.19.8 vocab_parallel_linear_cross_entropy",
}
base = {"libtorch": "libtorch", "chunked": "libtorch", "fused": "libtorch",
        "pytorch": "libtorch", "torch2_pytorch": "torch2_pytorch",
        "torch2_deepspeed_chunked": "torch2_pytorch", "torch2_deepspeed_fused": "torch2_pytorch"}
print("| dtype | loss | step ms | vs its torch's cross_entropy | step peak MB "
      "| peak vs its torch's cross_entropy |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for dt in dict.fromkeys(d for _, d in rows):
    for name in label:
        if (name, dt) not in rows:
            continue
        b = base[name]
        ms, peak = med(name, dt, "step_ms"), med(name, dt, "step_peak_mb")
        print(f"| {dt} | {label[name]} | {ms:.0f} | {ratio(name, b, dt, 'step_ms'):.2f}x "
              f"| {peak:.0f} | {ratio(name, b, dt, 'step_peak_mb'):.2f}x |")
PYEOF
