#!/usr/bin/env bash
# Pipeline parallelism on 2 ranks: train_gpt with --pipeline_parallel_size 2 against DeepSpeed's
# own PipelineEngine (Python, the same GPT, data, partition and ds_config:
# bench/common/deepspeed_train_gpt.py) and against pure data parallelism (ZeRO-0) on the same 2
# ranks: tokens/s and peak RSS per rank; then the measured bubble of each stage (its idle share of
# the batch, from wall_clock_breakdown's per-stage line) next to 1F1B's (P - 1) / (m + P - 1) for
# m = 1, 2, 4, 8 micro-batches. Builds nothing; makes .venv-deepspeed (DeepSpeed 0.15.4 over
# Debian's python3-torch) through scripts/setup_deepspeed_peer.sh when it is missing.
# Usage: bench/pipeline/run.sh [MODEL FLAGS...]   e.g. --n_layer 4 --n_embd 128
# Env: ROUNDS (3), STEPS (20), SKIP (3 warm-up steps not timed), MICRO_BATCHES ("1 2 4 8"),
#      CORPUS (data/austen.txt), DS_VENV (.venv-deepspeed; DS_VENV=none skips DeepSpeed),
#      OUT_DIR (default a new /tmp/pipeline_bench.* directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
SKIP=${SKIP:-3}
MICRO_BATCHES=${MICRO_BATCHES:-"1 2 4 8"}
PY=/usr/bin/python3
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
corpus=${CORPUS:-data/austen.txt}
model_flags=("$@")
DS_VENV=${DS_VENV:-$root/.venv-deepspeed}
die() { echo "pipeline bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; build it first"; done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
if [ "$DS_VENV" != none ]; then
  bash scripts/setup_deepspeed_peer.sh "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed"
fi
# Pinned environment (bench/README.md).
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=${OUT_DIR:-$(mktemp -d /tmp/pipeline_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO pipeline bench: rounds=$ROUNDS steps=$STEPS skip=$SKIP model_flags='${model_flags[*]}' out=$out load=$(cut -d' ' -f1-3 /proc/loadavg)"

# config(gas, wall_clock_breakdown) -> path: the example config with 4 sequences per micro-batch.
config() {
  local path="$out/ds_config_gas$1_wcb$2.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" "$2" <<'PYEOF'
import json, sys
src, dst, gas, wcb = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
cfg = json.load(open(src))
cfg.pop("train_batch_size", None)
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = gas
cfg["steps_per_print"] = 1000
cfg["wall_clock_breakdown"] = wcb
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

run() {  # run NAME CONFIG PIPE_SIZE
  local name=$1 cfg=$2 pp=$3
  "$launcher" --num_gpus 2 --master_port $((29600 + RANDOM % 300)) "$ours" --deepspeed_config "$cfg" \
    --data "$corpus" --steps "$STEPS" --eval_batches 1 --compact_vocab --metrics_file "$out/$name.jsonl" \
    --pipeline_parallel_size "$pp" "${model_flags[@]}" > "$out/$name.log" 2>&1 ||
    die "$name failed; see $out/$name.log"
}

run_deepspeed() {  # run_deepspeed NAME CONFIG: DeepSpeed's PipelineEngine, 2 stages
  DS_ACCELERATOR=cpu "$launcher" --num_gpus 2 --master_port $((29600 + RANDOM % 300)) \
    "$DS_VENV/bin/python" bench/common/deepspeed_train_gpt.py --deepspeed_config "$2" \
    --data "$corpus" --steps "$STEPS" --compact_vocab --metrics_file "$out/$1.jsonl" \
    --pipeline_parallel_size 2 "${model_flags[@]}" > "$out/$1.log" 2>&1 ||
    die "$1 failed; see $out/$1.log"
}

# Part 1: P=2 (ours, DeepSpeed) vs data parallelism, same global batch (2 ranks x 4 x 4 for DP;
# 1 replica x 4 x 8 for the pipelines: the same 32 sequences per step). The order rotates.
dp_cfg=$(config 4 0)
pp_cfg=$(config 8 0)
kinds=(dp pp)
[ "$DS_VENV" != none ] && kinds+=(ds)
for r in $(seq 1 "$ROUNDS"); do
  for ((i = 0; i < ${#kinds[@]}; i++)); do
    kind=${kinds[$(((i + r) % ${#kinds[@]}))]}
    case $kind in
      dp) run "dp_$r" "$dp_cfg" 1 ;;
      pp) run "pp_$r" "$pp_cfg" 2 ;;
      ds) run_deepspeed "ds_$r" "$pp_cfg" ;;
    esac
  done
done

[ "$DS_VENV" != none ] && grep -h "deepspeed_train_gpt: deepspeed" "$out/ds_1.log" | sed 's/^\[rank 0\] /INFO /'

# Part 2: the bubble against the micro-batch count.
for m in $MICRO_BATCHES; do run "bubble_m$m" "$(config "$m" 1)" 2; done

"$PY" - "$out" "$ROUNDS" "$SKIP" "$MICRO_BATCHES" "${kinds[@]}" <<'PYEOF'
import json, re, statistics, sys
out, rounds, skip, mbs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
kinds = sys.argv[5:]
names = {"dp": "ours, data parallel", "pp": "ours, pipeline P=2", "ds": "DeepSpeed, pipeline P=2"}
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
res = {}
for kind in kinds:
    tps, peak, loss = [], [], []
    for r in range(1, rounds + 1):
        rs = rows(f"{kind}_{r}")
        tps.append(statistics.median(x["tokens_per_s"] for x in rs[skip:]))
        peak.append(max(rs[-1]["memory_bytes"]["peak_rss"]) / 2**20)
        loss.append(rs[-1]["loss"])
    res[kind] = (statistics.median(tps), statistics.median(peak), statistics.median(loss))
    print(f"RESULT {kind}_tokens_per_s median={statistics.median(tps):.0f} min={min(tps):.0f} "
          f"max={max(tps):.0f} n={rounds} unit=tokens/s")
    print(f"RESULT {kind}_peak_rss_per_rank median={statistics.median(peak):.0f} unit=MiB")
print("| run | tokens/s (median) | peak RSS per rank (MiB) | loss at the last step |")
print("|---|---|---|---|")
for kind in kinds:
    print(f"| {names[kind]} | {res[kind][0]:.0f} | {res[kind][1]:.0f} | {res[kind][2]:.4f} |")
print(f"RATIO pipeline/data-parallel tokens/s {res['pp'][0] / res['dp'][0]:.2f}, "
      f"peak RSS per rank {res['pp'][1] / res['dp'][1]:.2f}")
if "ds" in res:
    print(f"RATIO ours/DeepSpeed pipeline tokens/s {res['pp'][0] / res['ds'][0]:.2f}, "
          f"peak RSS per rank {res['pp'][1] / res['ds'][1]:.2f}")
P = 2
print("micro-batches | 1F1B bubble (P-1)/(m+P-1) | measured idle share per stage (median over steps)")
line = re.compile(r"\[pipe stage (\d+)/(\d+)\] .*\| idle ([0-9.]+)%")
for m in mbs:
    per_stage = {}
    for l in open(f"{out}/bubble_m{m}.log"):
        g = line.search(l)
        if g: per_stage.setdefault(int(g.group(1)), []).append(float(g.group(3)))
    meas = ", ".join(f"stage {s}: {statistics.median(v[skip:] or v):.1f}%" for s, v in sorted(per_stage.items()))
    print(f"{int(m):13d} | {100.0 * (P - 1) / (int(m) + P - 1):25.1f}% | {meas}")
PYEOF
