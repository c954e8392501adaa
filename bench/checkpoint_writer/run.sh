#!/usr/bin/env bash
# checkpoint.writer's cost to training (docs/checkpoints.md "Writers"): checkpoint_writer_bench
# (ours) and deepspeed_checkpoint_writer.py (DeepSpeed 0.19.8 in .venv-deepspeed-torch2, made by
# scripts/setup_deepspeed_peer.sh) train the same MLP in one process and, per round, time STEPS
# training steps alone and after a save_checkpoint; the difference is what a checkpoint costs
# training, the save_checkpoint call how long training stops. Variants run interleaved, ROUNDS
# rounds each; medians and ratios to DeepSpeed's default writer. Builds nothing.
# Usage: bench/checkpoint_writer/run.sh
# Env: STAGE (0: DeepSpeed 0.19.8's decoupled writer fails at ZeRO 1-2 on CPU, see the note it
#      prints), HIDDEN (2048), LAYERS (12: 50M parameters, a 0.6 GB checkpoint at stage 0),
#      BATCH (16), STEPS (4), ROUNDS (6), REPEATS (2: processes per variant, their rounds pooled),
#      CKPT_DIR (checkpoints; default a new folder under /var/tmp, a disk rather than tmpfs),
#      DS_VENV (.venv-deepspeed-torch2; none leaves DeepSpeed out).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
STAGE=${STAGE:-0}
HIDDEN=${HIDDEN:-2048}
LAYERS=${LAYERS:-12}
BATCH=${BATCH:-16}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-6}
REPEATS=${REPEATS:-2}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
ours=build/bin/checkpoint_writer_bench
die() { echo "checkpoint_writer: $*" >&2; exit 1; }
[ -x "$ours" ] || die "$ours not found; build it first with scripts/build.sh"
if [ "$DS_VENV" != none ] && [ ! -x "$DS_VENV/bin/python" ]; then
  bash scripts/setup_deepspeed_peer.sh --torch2 "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed (DS_VENV=none leaves DeepSpeed out)"
fi
ckpt=${CKPT_DIR:-$(mktemp -d /var/tmp/ckpt_bench.XXXXXX)}
out=$(mktemp -d /tmp/checkpoint_writer.XXXXXX)
trap 'rm -rf "$ckpt"' EXIT
# Pinned environment (bench/README.md): one thread for training, so the second core is free for
# a background writer on both sides.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
fs=$(df -T "$ckpt" | awk 'NR==2 {print $2}')
echo "INFO checkpoint_writer: stage=$STAGE hidden=$HIDDEN layers=$LAYERS batch=$BATCH" \
  "steps=$STEPS rounds=$ROUNDS repeats=$REPEATS ckpt=$ckpt ($fs) out=$out"

# name | writer JSON ("none": no writer section)
variants=(
  "ours_standard|none"
  "ours_python|{\"type\": \"python\"}"
  "ours_fast|{\"type\": \"fast\"}"
  "ours_fast_single|{\"type\": \"fast\", \"io_buffer_double\": false}"
  "ours_decoupled_fast|{\"type\": \"fast\", \"decoupled\": true}"
  "ours_decoupled_python|{\"type\": \"python\", \"decoupled\": true}"
  "ours_mock|{\"type\": \"mock\"}"
)
# DeepSpeed 0.19.8 needs data_parallel set (without it: AttributeError 'dp_rank'), and its FAST
# writer pins memory through CUDA (no CPU run).
if [ "$DS_VENV" != none ]; then
  variants+=(
    "ds_standard|none"
    "ds_python|{\"type\": \"python\", \"data_parallel\": \"replica\"}"
    "ds_decoupled_python|{\"type\": \"python\", \"decoupled\": true,
                          \"data_parallel\": \"replica\"}"
  )
fi
common=(--hidden "$HIDDEN" --layers "$LAYERS" --batch "$BATCH" --steps "$STEPS"
        --rounds "$ROUNDS" --stage "$STAGE" --dir "$ckpt/run")
for ((rep = 1; rep <= REPEATS; rep++)); do
  for entry in "${variants[@]}"; do
    name=${entry%%|*}
    writer=${entry#*|}
    log="$out/$name.$rep.log"
    if [[ $name == ours_* ]]; then
      cmd=("$ours" "${common[@]}" --writer "$writer" --name "$name")
    else
      cmd=(env DS_ACCELERATOR=cpu "$DS_VENV/bin/python"
           bench/checkpoint_writer/deepspeed_checkpoint_writer.py
           "${common[@]}" --writer "$writer" --name "$name")
    fi
    if ! "${cmd[@]}" >"$log" 2>&1; then
      echo "WARN $name (repeat $rep) failed: $(grep -E 'Error|error' "$log" | tail -n 1)"
    fi
    grep '^{"variant"' "$log" >>"$out/rounds.jsonl" || true
  done
done
python3 - "$out/rounds.jsonl" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["variant"], []).append(r)
def med(xs): return statistics.median(xs) if xs else float("nan")
summary = {}
for name, rs in by.items():
    rs = [r for r in rs if r["round"] > 0]  # round 0: a first save (and DeepSpeed's process start)
    cost = [r["steps_with_save_s"] - r["steps_s"] for r in rs]
    summary[name] = dict(cost=med(cost), call=med([r["save_call_s"] for r in rs]),
                         steps=med([r["steps_s"] for r in rs]),
                         gb=med([r["bytes"] for r in rs]) / 1e9, n=len(rs))
    print(f"RESULT {name} checkpoint_cost median={summary[name]['cost']:.3f} "
          f"min={min(cost):.3f} max={max(cost):.3f} n={len(cost)} unit=s")
print()
print(f"{'variant':24} {'GB':>6} {'steps alone s':>14} {'save call s':>12} "
      f"{'cost to training s':>19} {'cost / ds_standard':>19}")
ref = summary.get("ds_standard", {}).get("cost")
for name, s in summary.items():
    ratio = f"{s['cost'] / ref:.2f}" if ref else "-"
    print(f"{name:24} {s['gb']:6.2f} {s['steps']:14.3f} {s['call']:12.3f} "
          f"{s['cost']:19.3f} {ratio:>19}")
PYEOF
