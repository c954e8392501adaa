#!/usr/bin/env bash
# ZeRO-Offload on this machine, one command:
#  1. train_gpt on 2 ranks, ZeRO-2 with offload_optimizer.device "cpu" against ZeRO-2 without:
#     tokens/s (median step time over the steps after SKIP, median over ROUNDS alternating runs).
#  2. The AIO engine's write/read bandwidth against plain pwrite/pread (bench/offload/aio_bench).
# Prints RESULT lines and RATIO lines. Builds nothing: build train_gpt, deepspeed (launcher) and
# aio_bench into BUILD_DIR first.
# Usage: bench/offload/run.sh [MODEL FLAGS...]   e.g. --n_layer 4 --n_head 4 --n_embd 128
# Env: BUILD_DIR (build), ROUNDS (3), STEPS (20), SKIP (3), DS_CONFIG
#      (examples/train_gpt/ds_config.json; stage and offload are set per variant), AIO_DIR (/tmp:
#      where the bandwidth file goes; point it at the NVMe you would offload to), AIO_MB (256).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
SKIP=${SKIP:-3}
DS_CONFIG=${DS_CONFIG:-examples/train_gpt/ds_config.json}
AIO_DIR=${AIO_DIR:-/tmp}
AIO_MB=${AIO_MB:-256}
PY=/usr/bin/python3
launcher=$BUILD_DIR/bin/deepspeed
ours=$BUILD_DIR/bin/train_gpt
aio_bench=$BUILD_DIR/bin/aio_bench
corpus=data/austen.txt
model_flags=("$@")

die() { echo "offload bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours" "$aio_bench"; do
  [ -x "$bin" ] || die "$bin not found; build it first (cmake --build $BUILD_DIR --target $(basename "$bin"))"
done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"

# Pinned environment (bench/README.md): OpenBLAS's kernels, one thread per rank, Gloo on
# loopback.
source bench/common/pin_openblas_core.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=$(mktemp -d /tmp/offload_bench.XXXXXX)
echo "INFO offload bench: rounds=$ROUNDS steps=$STEPS skip=$SKIP config=$DS_CONFIG out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo); load $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$DS_CONFIG" "$out" <<'PYEOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
base = json.load(open(src))
for name, offload in (("plain", None), ("offload", {"device": "cpu", "pin_memory": True})):
    cfg = json.loads(json.dumps(base))
    z = cfg.setdefault("zero_optimization", {})
    z["stage"] = 2
    if offload:
        z["offload_optimizer"] = offload
    json.dump(cfg, open(os.path.join(out, f"ds_config_{name}.json"), "w"), indent=2)
PYEOF

port=$((29700 + RANDOM % 2000))
for ((r = 1; r <= ROUNDS; r++)); do
  order=(plain offload)
  ((r % 2 == 0)) && order=(offload plain)
  for v in "${order[@]}"; do
    "$launcher" --num_gpus 2 --master_port "$port" "$ours" --deepspeed_config "$out/ds_config_$v.json" \
      --steps "$STEPS" --data "$corpus" --metrics_file "$out/round${r}_$v.jsonl" "${model_flags[@]}" \
      >"$out/round${r}_$v.log" 2>&1 || { tail -n 20 "$out/round${r}_$v.log" >&2; die "$v round $r failed"; }
    port=$((port + 1))
  done
done

"$PY" - "$out" "$ROUNDS" "$SKIP" <<'PYEOF'
import json, statistics, sys
out, rounds, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tps = {}
for v in ("plain", "offload"):
    per_round = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{out}/round{r}_{v}.jsonl")]
        tokens_per_step = rows[-1]["tokens"] / rows[-1]["step"] if rows[-1]["step"] else 0
        times = [row["step_time_s"] for row in rows[skip:]]
        per_round.append(tokens_per_step / statistics.median(times))
    tps[v] = statistics.median(per_round)
    print(f"RESULT train_gpt ZeRO-2 {v:8s} tokens/s {tps[v]:10.1f}  (rounds: "
          + ", ".join(f"{x:.1f}" for x in per_round) + ")")
print(f"RATIO offload/plain tokens/s {tps['offload'] / tps['plain']:.3f}")
PYEOF
grep -h 'offload_optimizer:' "$out"/round1_offload.log | tail -1 | sed 's/^/INFO /' || true

"$aio_bench" "$AIO_DIR" "$AIO_MB" 5
