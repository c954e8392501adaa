#!/usr/bin/env bash
# One Mixtral-shaped MoE block (dropless, top-K of E SwiGLU experts), forward + backward on T
# tokens, in one process (docs/moe.md): ours (moe::TokenChoiceMoE, the block AutoEP shards;
# token_choice_moe_bench) and transformers 4.47's MixtralSparseMoeBlock in Python on the same
# LibTorch build (Debian's python3-torch, through .venv); DeepSpeed 0.19.8's AutoEPMoELayer (a
# one-layer Mixtral through deepspeed.initialize with expert_parallel, its block timed alone)
# with transformers 5.15's own block beside it, on torch 2.11 (.venv-deepspeed-torch2, made by
# scripts/setup_deepspeed_peer.sh --torch2; its wheel's GEMM differs from Debian's, so each side
# is also compared with the transformers block on its own torch). Each process runs ITERS timed
# steps after a warm-up; the forms run interleaved, ROUNDS rounds; medians of the step time and
# of a step's resident peak above the memory before it, and of each round's ratios. Builds
# nothing (build/bin/token_choice_moe_bench comes with scripts/build.sh).
# Env: T (2048 tokens), H (512), F (1024), E (8), K (2), DTYPES ("fp32 bf16"), ROUNDS (3),
#      ITERS (3), THREADS (2), DS_VENV (.venv-deepspeed-torch2; none leaves it out),
#      HF_VENV (.venv, made by scripts/setup_python_refs.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
T=${T:-2048}
H=${H:-512}
F=${F:-1024}
E=${E:-8}
K=${K:-2}
DTYPES=${DTYPES:-"fp32 bf16"}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-3}
THREADS=${THREADS:-2}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
HF_VENV=${HF_VENV:-$root/.venv}
ours=build/bin/token_choice_moe_bench
die() { echo "token_choice_moe bench: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first (scripts/build.sh)"
[ -x "$HF_VENV/bin/python" ] || bash scripts/setup_python_refs.sh >/dev/null ||
  die "scripts/setup_python_refs.sh failed"
if [ "$DS_VENV" != none ]; then
  bash scripts/setup_deepspeed_peer.sh --torch2 "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed (DS_VENV=none leaves DeepSpeed out)"
fi
# Pinned environment (bench/README.md): auto-detected OpenBLAS kernels; two threads whose idle
# pool does not spin against the other's.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE DS_ACCELERATOR=cpu
out=$(mktemp -d /tmp/token_choice_moe_bench.XXXXXX)
echo "INFO token_choice_moe bench: T=$T H=$H F=$F E=$E K=$K dtypes=($DTYPES) rounds=$ROUNDS" \
  "iters=$ITERS threads=$THREADS load=$(cut -d' ' -f1-3 /proc/loadavg)"

py=bench/token_choice_moe/python_token_choice_moe.py
for ((r = 1; r <= ROUNDS; r++)); do
  for dt in $DTYPES; do
    run() {  # NAME COMMAND...: one process, its result line recorded
      local name=$1 res
      shift
      res=$("$@" 2>"$out/stderr.txt" | tail -1) || die "$name failed: $(tail -3 "$out/stderr.txt")"
      echo "$name $dt $res" >> "$out/results.txt"
      echo "INFO round $r $dt $name: $res"
    }
    run ours "$ours" "$T" "$H" "$F" "$E" "$K" "$dt" "$ITERS"
    run transformers "$HF_VENV/bin/python" "$py" transformers "$T" "$H" "$F" "$E" "$K" "$dt" \
      "$ITERS"
    if [ "$DS_VENV" != none ]; then
      run torch2_transformers "$DS_VENV/bin/python" "$py" transformers "$T" "$H" "$F" "$E" "$K" \
        "$dt" "$ITERS"
      run torch2_deepspeed "$DS_VENV/bin/python" "$py" deepspeed "$T" "$H" "$F" "$E" "$K" "$dt" \
        "$ITERS"
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
    "ours": "ours TokenChoiceMoE (LibTorch 1.13)",
    "transformers": "transformers 4.47 MixtralSparseMoeBlock (PyTorch 1.13)",
    "torch2_transformers": "transformers 5.15 MixtralSparseMoeBlock (torch 2.11)",
    "torch2_deepspeed": "DeepSpeed 0.19.8 AutoEPMoELayer (torch 2.11)",
}
base = {"ours": "transformers", "transformers": "transformers",
        "torch2_transformers": "torch2_transformers", "torch2_deepspeed": "torch2_transformers"}
print("| dtype | block | step ms | vs transformers on its torch | vs DeepSpeed | step peak MB |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for dt in dict.fromkeys(d for _, d in rows):
    for name in label:
        if (name, dt) not in rows:
            continue
        ds = (f"{ratio(name, 'torch2_deepspeed', dt, 'step_ms'):.2f}x"
              if ("torch2_deepspeed", dt) in rows else "-")
        print(f"| {dt} | {label[name]} | {med(name, dt, 'step_ms'):.0f} "
              f"| {ratio(name, base[name], dt, 'step_ms'):.2f}x | {ds} "
              f"| {med(name, dt, 'step_peak_mb'):.0f} |")
PYEOF
