#!/usr/bin/env bash
# Tensor parallelism on 2 ranks: train_gpt with --tensor_parallel_size 2 (AutoTP: attention and
# MLP split, one replica) against pure data parallelism (2 replicas, ZeRO-0) and the pipeline
# (--pipeline_parallel_size 2, one replica), the same 32 sequences per step on each: tokens/s,
# peak RSS per rank and bytes sent per rank per step (comm::bytes_sent, train_gpt's comm_bytes),
# medians over the timed steps and rounds, with the ratios to data parallelism. Builds nothing.
# Usage: bench/tensor_parallel/run.sh [MODEL FLAGS...]   e.g. --n_layer 4 --n_embd 128
# Env: ROUNDS (3), STEPS (20), SKIP (3 warm-up steps not timed), CORPUS (data/austen.txt;
#      tests/data/austen_slice.txt for a quick look), OUT_DIR (default a new /tmp directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
SKIP=${SKIP:-3}
PY=/usr/bin/python3
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
corpus=${CORPUS:-data/austen.txt}
model_flags=("$@")
die() { echo "tensor parallel bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; build it first"; done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
# Pinned environment (bench/README.md).
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=${OUT_DIR:-$(mktemp -d /tmp/tp_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO tensor parallel bench: rounds=$ROUNDS steps=$STEPS skip=$SKIP model_flags='${model_flags[*]}' out=$out load=$(cut -d' ' -f1-3 /proc/loadavg)"

# config(gas) -> path: the example config with 4 sequences per micro-batch.
config() {
  local path="$out/ds_config_gas$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, gas = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(src))
cfg.pop("train_batch_size", None)
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = gas
cfg["steps_per_print"] = 1000
cfg.setdefault("zero_optimization", {})["stage"] = 0
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

run() {  # run NAME CONFIG EXTRA_FLAGS...
  local name=$1 cfg=$2
  shift 2
  "$launcher" --num_gpus 2 --master_port $((29600 + RANDOM % 300)) "$ours" --deepspeed_config "$cfg" \
    --data "$corpus" --steps "$STEPS" --eval_batches 1 --compact_vocab --metrics_file "$out/$name.jsonl" \
    "$@" "${model_flags[@]}" > "$out/$name.log" 2>&1 || die "$name failed; see $out/$name.log"
}

# 32 sequences per step: DP = 2 replicas x 4 x 4; TP and PP = 1 replica x 4 x 8.
dp_cfg=$(config 4)
one_cfg=$(config 8)
kinds=(dp tp pp)
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order so that no kind always runs first on a warming machine.
  for i in 0 1 2; do
    k=${kinds[$(((i + r) % 3))]}
    case $k in
      dp) run "dp_$r" "$dp_cfg" ;;
      tp) run "tp_$r" "$one_cfg" --tensor_parallel_size 2 ;;
      pp) run "pp_$r" "$one_cfg" --pipeline_parallel_size 2 ;;
    esac
  done
done

"$PY" - "$out" "$ROUNDS" "$SKIP" <<'PYEOF'
import json, statistics, sys
out, rounds, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
res = {}
for kind in ("dp", "tp", "pp"):
    tps, peak, comm = [], [], []
    for r in range(1, rounds + 1):
        rs = rows(f"{kind}_{r}")
        tps.append(statistics.median(x["tokens_per_s"] for x in rs[skip:]))
        peak.append(max(rs[-1]["memory_bytes"]["peak_rss"]) / 2**20)
        comm.append(statistics.median(x["comm_bytes"] for x in rs[skip:]) / 2**20)
    res[kind] = tuple(statistics.median(v) for v in (tps, peak, comm))
    print(f"RESULT {kind}_tokens_per_s median={res[kind][0]:.0f} min={min(tps):.0f} max={max(tps):.0f} n={rounds} unit=tokens/s")
    print(f"RESULT {kind}_peak_rss_per_rank median={res[kind][1]:.0f} unit=MiB")
    print(f"RESULT {kind}_comm_bytes_per_rank_per_step median={res[kind][2]:.2f} unit=MiB")
for kind in ("tp", "pp"):
    print(f"RATIO {kind}/dp tokens/s {res[kind][0] / res['dp'][0]:.2f}, peak RSS per rank "
          f"{res[kind][1] / res['dp'][1]:.2f}, bytes sent per step {res[kind][2] / max(res['dp'][2], 1e-9):.2f}")
PYEOF
