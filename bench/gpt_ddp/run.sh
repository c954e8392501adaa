#!/usr/bin/env bash
# Throughput of train_gpt (our engine, 2 ranks, ZeRO-0) against PyTorch DDP on Gloo (the peer,
# bench/gpt_ddp/gpt_ddp.py under Debian's /usr/bin/python3): the same GPT, the same real tokens,
# the same step (AdamW, clipping, WarmupLR). Both are started by our launcher. Builds nothing.
# Usage: bench/gpt_ddp/run.sh [MODEL FLAGS...]   e.g. --n_layer 4 --n_head 4 --n_embd 128
# Env: ROUNDS (3), STEPS (30), SKIP (3 warm-up steps not timed), DS_CONFIG (train_gpt's config),
#      OUT_DIR (metrics and logs; default a new /tmp/gpt_ddp.* directory), RUN_TIMEOUT_S (600).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
SKIP=${SKIP:-3}
DS_CONFIG=${DS_CONFIG:-examples/train_gpt/ds_config.json}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-600}
PY=/usr/bin/python3  # Debian's python3-torch (same LibTorch build); not the pyenv python3 on PATH
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
corpus=data/austen.txt
model_flags=("$@")

die() { echo "gpt_ddp: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do
  [ -x "$bin" ] || die "$bin not found; build it first with scripts/build.sh"
done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
if ! { [ -x "$PY" ] && "$PY" -c 'import torch' 2>/dev/null; }; then
  # The peer needs Debian's python3-torch (the same LibTorch build); only this script needs it.
  echo "INFO gpt_ddp: installing python3-torch for the PyTorch peer" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq --no-install-recommends python3-torch; } >&2 ||
    die "could not install python3-torch; apt-get install --no-install-recommends python3-torch"
  "$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch after installing python3-torch"
fi
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"

# Pinned environment (docs: shared reference cpu-baselines.md §2): auto-detected OpenBLAS
# kernels, one thread per rank for both pools, Gloo on loopback.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo

out=${OUT_DIR:-$(mktemp -d /tmp/gpt_ddp.XXXXXX)}
mkdir -p "$out"
# (awk reads all input: an early exit would SIGPIPE ldconfig and, under pipefail, end the script)
blas_alt=$(ldconfig -p | awk '/libblas\.so\.3 .*x86-64/ && !f {print $NF; f = 1}')
echo "INFO gpt_ddp: rounds=$ROUNDS steps=$STEPS skip=$SKIP config=$DS_CONFIG model_flags='${model_flags[*]}' out=$out"
echo "INFO env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OMP_NUM_THREADS=$OMP_NUM_THREADS" \
  "OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME cpus=$(getconf _NPROCESSORS_ONLN)"
echo "INFO blas: libblas.so.3 -> $(readlink -f "${blas_alt:-/usr/lib/x86_64-linux-gnu/libblas.so.3}")" \
  "| train_gpt loads $(ldd "$ours" | awk '/libblas/ {print $3}' | xargs -r readlink -f)"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# train_gpt tokenizes the corpus into data/austen.txt.gpt2.u16 on first use; the peer only reads it.
if ! "$PY" bench/gpt_ddp/gpt_ddp.py --check_data --data "$corpus"; then
  echo "INFO token cache $corpus.gpt2.u16 missing or stale: running train_gpt once to write it"
  "$launcher" --num_gpus 1 "$ours" --steps 1 --data "$corpus" >"$out/make_cache.log" 2>&1 ||
    { cat "$out/make_cache.log" >&2; die "train_gpt --steps 1 failed (log above)"; }
  "$PY" bench/gpt_ddp/gpt_ddp.py --check_data --data "$corpus" || die "still no token cache after train_gpt"
fi

port=$((29600 + RANDOM % 2000))
# run_side SIDE ROUND: one 2-rank launch; metrics in $out/roundR_SIDE.jsonl, log beside it.
run_side() {
  local side=$1 r=$2 metrics="$out/round$2_$1.jsonl" log="$out/round$2_$1.log" rc=0
  local cmd=("$launcher" --num_gpus 2 --master_port "$port")
  port=$((port + 1))
  if [ "$side" = ours ]; then
    cmd+=("$ours")
  else
    cmd+=("$PY" bench/gpt_ddp/gpt_ddp.py)
  fi
  cmd+=(--deepspeed_config "$DS_CONFIG" --steps "$STEPS" --data "$corpus" --metrics_file "$metrics"
        "${model_flags[@]}")
  rm -f "$metrics"
  "$PY" bench/common/cpumon.py --name "gpt_ddp.$side.round$r" --timeout "$RUN_TIMEOUT_S" -- \
    "${cmd[@]}" >"$log" 2>&1 || rc=$?
  grep -E '^NOISE|params|step 1 \||held-out|INFO|WARN|rror' "$log" | sed "s/^/  [$side] /" || true
  local done_steps
  done_steps=$( [ -f "$metrics" ] && wc -l <"$metrics" || echo 0)
  if ((done_steps < STEPS)); then
    tail -n 30 "$log" >&2
    die "$side round $r: exit status $rc after $done_steps of $STEPS steps (log: $log)"
  fi
  ((rc == 0)) || echo "WARN $side round $r: exit status $rc after all $STEPS steps (teardown?); log: $log"
}

for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then order=(ours peer); else order=(peer ours); fi
  echo "ROUND $r/$ROUNDS order=${order[0]},${order[1]}"
  for side in "${order[@]}"; do run_side "$side" "$r"; done
  "$PY" bench/gpt_ddp/report.py round "$r" "$out/round${r}_ours.jsonl" "$out/round${r}_peer.jsonl" --skip "$SKIP"
done
"$PY" bench/gpt_ddp/report.py summary "$out" --skip "$SKIP"
