#!/usr/bin/env bash
# Throughput and peak RSS of train_gpt under ZeRO stages 0-3 (our engine, 2 ranks) against
# Python DeepSpeed under the same stages (bench/common/deepspeed_train_gpt.py in .venv-deepspeed:
# DeepSpeed 0.15.4 over Debian's python3-torch, made by scripts/setup_deepspeed_peer.sh when
# missing), PyTorch DDP and DDP + ZeroRedundancyOptimizer (PyTorch's stage-1 analogue; both from
# bench/gpt_ddp/gpt_ddp.py under Debian's /usr/bin/python3): the same GPT and initial weights, the
# same real tokens, the same batch and step. All are started by our launcher. Builds nothing.
# Usage: bench/zero_stages/run.sh [MODEL FLAGS...]   e.g. --n_layer 4 --n_head 4 --n_embd 128
# Env: ROUNDS (3), STEPS (30), SKIP (3 warm-up steps not timed), DS_CONFIG (the base config; the
#      per-stage configs are made from it), OUT_DIR (configs, metrics and logs; default a new
#      /tmp/zero_stages.* directory), RUN_TIMEOUT_S (600); on a shared machine: QUIET_WAIT_S (300:
#      before each run, wait up to this long for other processes to use < 0.25 cores; 0 = never
#      wait), MAX_FOREIGN_CORES (0.3) and RETRIES (2: a run during which other processes used
#      more than MAX_FOREIGN_CORES is redone, after waiting again, up to RETRIES times);
#      DS_VENV (.venv-deepspeed; DS_VENV=none leaves DeepSpeed out); VARIANTS (the runs of a
#      round, default all: ours0..ours3 ddp zero_ro ds0..ds3).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
SKIP=${SKIP:-3}
DS_CONFIG=${DS_CONFIG:-examples/train_gpt/ds_config.json}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-600}
QUIET_WAIT_S=${QUIET_WAIT_S:-300}
MAX_FOREIGN_CORES=${MAX_FOREIGN_CORES:-0.3}
RETRIES=${RETRIES:-2}
PY=/usr/bin/python3  # Debian's python3-torch (same LibTorch build); not the pyenv python3 on PATH
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
peer=bench/gpt_ddp/gpt_ddp.py
corpus=data/austen.txt
model_flags=("$@")
DS_VENV=${DS_VENV:-$root/.venv-deepspeed}
# Odd rounds run them in this order, even rounds in reverse, so each keeps no fixed position.
variants=(ours0 ours1 ours2 ours3 ddp zero_ro)
[ "$DS_VENV" != none ] && variants+=(ds0 ds1 ds2 ds3)

die() { echo "zero_stages: $*" >&2; exit 1; }
if [ -n "${VARIANTS:-}" ]; then
  read -r -a variants <<<"$VARIANTS"
  for v in "${variants[@]}"; do
    [[ $v =~ ^(ours[0-3]|ddp|zero_ro|ds[0-3])$ ]] || die "VARIANTS: unknown run '$v'"
    if [[ $v == ds* && $DS_VENV == none ]]; then die "VARIANTS names $v but DS_VENV=none"; fi
  done
fi
for bin in "$launcher" "$ours"; do
  [ -x "$bin" ] || die "$bin not found; build it first with scripts/build.sh"
done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
[ -f "$DS_CONFIG" ] || die "DS_CONFIG $DS_CONFIG not found"
"$PY" -c 'import torch' 2>/dev/null ||
  die "$PY cannot import torch; install Debian's python3-torch (bench/gpt_ddp/run.sh does it)"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
if [[ " ${variants[*]} " == *" ds"* ]]; then  # only when a DeepSpeed run is among them
  bash scripts/setup_deepspeed_peer.sh "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed (DS_VENV=none leaves DeepSpeed out)"
fi

# Pinned environment (bench/README.md): auto-detected OpenBLAS kernels, one thread per rank for
# both pools, Gloo on loopback.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo

out=${OUT_DIR:-$(mktemp -d /tmp/zero_stages.XXXXXX)}
mkdir -p "$out"
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# LOAD lines go to the output and to $out/load.txt, which the summary repeats.
log_load() { echo "LOAD $1: load average $(loadavg)" | tee -a "$out/load.txt"; }
echo "INFO zero_stages: rounds=$ROUNDS steps=$STEPS skip=$SKIP config=$DS_CONFIG model_flags='${model_flags[*]}' out=$out"
rm -f "$out/load.txt"
log_load "start ($(getconf _NPROCESSORS_ONLN) cpus; 1/5/15-minute averages)"
echo "INFO env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OMP_NUM_THREADS=$OMP_NUM_THREADS" \
  "OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME"
echo "INFO blas: train_gpt loads $(ldd "$ours" | awk '/libblas/ {print $3}' | xargs -r readlink -f)"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo)"

# The same config for every stage; only zero_optimization.stage differs.
"$PY" - "$DS_CONFIG" "$out" <<'PYEOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
with open(src) as f:
    base = json.load(f)
for stage in (0, 1, 2, 3):
    cfg = json.loads(json.dumps(base))
    cfg.setdefault("zero_optimization", {})["stage"] = stage
    with open(os.path.join(out, f"ds_config_stage{stage}.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
PYEOF
echo "INFO configs: $out/ds_config_stage{0,1,2,3}.json (from $DS_CONFIG, only zero_optimization.stage changed)"

# Every round runs copies taken now: others rebuild build/ while a long benchmark runs.
mkdir -p "$out/bin"
echo "INFO binaries: $(stat -c '%n built %y' "$launcher" "$ours" | cut -d. -f1 | paste -sd';'), copied to $out/bin"
cp "$launcher" "$ours" "$out/bin/"
launcher=$out/bin/deepspeed
ours=$out/bin/train_gpt

# train_gpt tokenizes the corpus into data/austen.txt.gpt2.u16 on first use; the peer only reads it.
if ! "$PY" "$peer" --check_data --data "$corpus"; then
  echo "INFO token cache $corpus.gpt2.u16 missing or stale: running train_gpt once to write it"
  "$launcher" --num_gpus 1 "$ours" --steps 1 --data "$corpus" >"$out/make_cache.log" 2>&1 ||
    { cat "$out/make_cache.log" >&2; die "train_gpt --steps 1 failed (log above)"; }
  "$PY" "$peer" --check_data --data "$corpus" || die "still no token cache after train_gpt"
fi

port=$((29600 + RANDOM % 2000))
# run_variant VARIANT ROUND: one 2-rank launch, redone while other processes disturbed it; metrics
# in $out/roundR_VARIANT.jsonl, log beside it (a disturbed attempt's log is kept as .log.noisyN).
run_variant() {
  local v=$1 r=$2 attempt foreign
  for ((attempt = 0; ; attempt++)); do
    if ((QUIET_WAIT_S > 0)); then
      "$PY" bench/zero_stages/wait_quiet.py --timeout_s "$QUIET_WAIT_S" | sed "s/^/  [$v] /"
    fi
    run_once "$v" "$r"
    foreign=$(sed -n 's/^NOISE .* foreign_cores=\([0-9.]*\).*/\1/p' "$out/round${r}_$v.log")
    awk -v f="${foreign:-0}" -v m="$MAX_FOREIGN_CORES" 'BEGIN {exit !(f > m)}' || return 0
    if ((attempt >= RETRIES)); then
      echo "WARN $v round $r: other processes used $foreign cores (> $MAX_FOREIGN_CORES) in all" \
        "$((attempt + 1)) attempts; keeping the last"
      return 0
    fi
    echo "  [$v] RETRY: other processes used $foreign cores (> $MAX_FOREIGN_CORES)"
    mv "$out/round${r}_$v.log" "$out/round${r}_$v.log.noisy$((attempt + 1))"
  done
}

run_once() {
  local v=$1 r=$2 metrics="$out/round$2_$1.jsonl" log="$out/round$2_$1.log" rc=0
  local cmd=("$launcher" --num_gpus 2 --master_port "$port")
  port=$((port + 1))
  case "$v" in
    ours[0-3]) cmd+=("$ours" --deepspeed_config "$out/ds_config_stage${v#ours}.json") ;;
    ddp) cmd+=("$PY" "$peer" --deepspeed_config "$out/ds_config_stage0.json") ;;
    zero_ro) cmd+=("$PY" "$peer" --zero_redundancy --deepspeed_config "$out/ds_config_stage1.json") ;;
    ds[0-3]) cmd=(env DS_ACCELERATOR=cpu "${cmd[@]}" "$DS_VENV/bin/python"
                  bench/common/deepspeed_train_gpt.py
                  --deepspeed_config "$out/ds_config_stage${v#ds}.json") ;;
  esac
  cmd+=(--steps "$STEPS" --data "$corpus" --metrics_file "$metrics" "${model_flags[@]}")
  rm -f "$metrics"
  "$PY" bench/common/cpumon.py --name "zero_stages.$v.round$r" --timeout "$RUN_TIMEOUT_S" -- \
    "${cmd[@]}" >"$log" 2>&1 || rc=$?
  grep -E '^NOISE|WARN|rror' "$log" | sed "s/^/  [$v] /" || true
  local done_steps
  done_steps=$( [ -f "$metrics" ] && wc -l <"$metrics" || echo 0)
  if ((done_steps < STEPS)); then
    tail -n 30 "$log" >&2
    die "$v round $r: exit status $rc after $done_steps of $STEPS steps (log: $log)"
  fi
  ((rc == 0)) || echo "WARN $v round $r: exit status $rc after all $STEPS steps (teardown?); log: $log"
}

for ((r = 1; r <= ROUNDS; r++)); do
  order=("${variants[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[i]}"); done
  fi
  echo "ROUND $r/$ROUNDS order=$(IFS=,; echo "${order[*]}")"
  log_load "round $r"
  for v in "${order[@]}"; do run_variant "$v" "$r"; done
  "$PY" bench/zero_stages/report.py round "$out" "$r" --skip "$SKIP"
done
log_load end
"$PY" bench/zero_stages/report.py summary "$out" --skip "$SKIP"
