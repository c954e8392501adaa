#!/usr/bin/env bash
# Autotuning: experiments and wall-clock to reach the best configuration, ours against DeepSpeed's
# search, on the same job (train_gpt, 2 ranks), the same memory budget per rank and the same
# machine; then the throughput of each one's choice, measured again (medians, interleaved).
# DeepSpeed's search runs through our tuner with DS_AUTOTUNING_SEARCH=deepspeed (its memory
# estimate, its minimum-micro-batch run, its 105/100/95% guesses, binary search with the 5%
# plateau rule, micro-batch list and refinement: docs/autotuning.md), because PyPI DeepSpeed's
# own autotuner cannot run on this CPU-only machine (the script checks and says why). Builds
# nothing.
# Usage: bench/autotuning/run.sh [MODEL FLAGS...]   (default: --n_layer 3 --n_head 4 --n_embd 384)
# Env: BUDGET_MB (100: memory per rank, DS_MEMORY_BUDGET_BYTES; ZeRO-0 needs ~125 MiB, ZeRO-2
#      ~85 MiB for the default model here), MAX_MBS (4), ROUNDS (3 throughput
#      runs of each choice), STEPS (end_profile_step; 3), OUT_DIR (default /tmp/autotuning.*),
#      DS_VENV (a venv with PyPI deepspeed to check; default /tmp/dsvenv).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

BUDGET_MB=${BUDGET_MB:-100}
MAX_MBS=${MAX_MBS:-4}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
DS_VENV=${DS_VENV:-/tmp/dsvenv}
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
fixture=tests/data/austen_slice.txt
model_flags=("$@")
[ ${#model_flags[@]} -gt 0 ] || model_flags=(--n_layer 3 --n_head 4 --n_embd 384)

die() { echo "autotuning bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do
  [ -x "$bin" ] || die "$bin not found; build it first with scripts/build.sh"
done

source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
export DS_MEMORY_BUDGET_BYTES=$((BUDGET_MB << 20)) DS_AUTOTUNING_EXPERIMENT_TIMEOUT_S=${DS_AUTOTUNING_EXPERIMENT_TIMEOUT_S:-300}
out=${OUT_DIR:-$(mktemp -d /tmp/autotuning.XXXXXX)}
mkdir -p "$out"
corpus=$out/corpus.txt  # the fixture 4 times: a validation split for micro-batches up to 8
for _ in 1 2 3 4; do cat "$fixture"; done > "$corpus"
echo "INFO autotuning bench: budget ${BUDGET_MB} MiB/rank, max micro-batch $MAX_MBS, model '${model_flags[*]}', out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo), $(getconf _NPROCESSORS_ONLN) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Can PyPI DeepSpeed's autotuner run here at all?
if [ -x "$DS_VENV/bin/python" ] && "$DS_VENV/bin/python" -c 'import deepspeed' >/dev/null 2>&1; then
  ds_check=$("$DS_VENV/bin/python" - <<'PY' 2>&1 | tail -3
import deepspeed, torch
from deepspeed.accelerator import get_accelerator
acc = get_accelerator()
print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, accelerator {acc.device_name()}, "
      f"communication backend {acc.communication_backend_name()}")
try:
    import deepspeed.autotuning.autotuner as a  # the tuner itself imports
    print("autotuner importable; memory per device:", acc.total_memory())
except Exception as e:
    print("autotuner: " + repr(e))
PY
)
  echo "INFO PyPI DeepSpeed: $ds_check"
else
  echo "INFO PyPI DeepSpeed: not installed in $DS_VENV (python3 -m venv --system-site-packages $DS_VENV && $DS_VENV/bin/pip install deepspeed tabulate hjson)"
fi
echo "INFO DeepSpeed's autotuner needs the training script to be a DeepSpeed Python job on an accelerator it can count (its ResourceManager reserves GPU slots and its memory estimate reads the GPU's size); the job here is the C++ train_gpt, so its search is run by our tuner (DS_AUTOTUNING_SEARCH=deepspeed) on the same experiments."

config() {  # $1 = results tag
  cat > "$out/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": "all"},
 "autotuning": {"enabled": true, "start_profile_step": 1, "end_profile_step": $STEPS,
                "max_train_micro_batch_size_per_gpu": $MAX_MBS, "num_tuning_micro_batch_sizes": 3,
                "results_dir": "$out/$1_results", "exps_dir": "$out/$1_exps"}}
JSON
}

job() {  # $1 = config path
  echo "$ours --deepspeed_config $1 --data $corpus --steps 100 --compact_vocab --eval_batches 1 --seq_len 32 ${model_flags[*]} --metrics_file $out/metrics.jsonl"
}

for who in ours deepspeed; do
  config "$who"
  search=""
  [ "$who" = deepspeed ] && search=deepspeed
  start=$(date +%s.%N)
  # shellcheck disable=SC2046
  DS_AUTOTUNING_SEARCH=$search "$launcher" --num_gpus 2 --master_port $((32000 + RANDOM % 2000)) --autotuning tune \
    $(job "$out/$who.json") > "$out/$who.log" 2>&1 || die "$who tuning failed; see $out/$who.log"
  end=$(date +%s.%N)
  python3 - "$out/${who}_results/autotuning_results.json" "$who" "$start" "$end" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
who = sys.argv[2]
wall = float(sys.argv[4]) - float(sys.argv[3])
ran = [e for e in r["experiments"] if e["status"] != "pruned"]
oom = [e for e in ran if e["status"] == "out of memory"]
pruned = [e for e in r["experiments"] if e["status"] == "pruned"]
print(f"RESULT {who}_experiments value={len(ran)} unit=experiments (out of memory {len(oom)}, pruned without running {len(pruned)})")
print(f"RESULT {who}_experiments_to_best value={r['best_experiment_number']} unit=experiments best={r['best']}")
print(f"RESULT {who}_time_to_best value={r['best_found_at_s']:.1f} unit=s")
print(f"RESULT {who}_tuning_wall value={wall:.1f} unit=s")
PY
done

# The throughput of each choice, measured again: ROUNDS runs each, interleaved.
for who in ours deepspeed; do
  python3 - "$out/${who}_results/ds_config_optimal.json" "$out/${who}_measure.json" "$out" "$STEPS" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["autotuning"] = {"enabled": True, "start_profile_step": 1, "end_profile_step": int(sys.argv[4]),
                   "metric_path": sys.argv[3] + "/measure_metric.json"}
json.dump(c, open(sys.argv[2], "w"))
PY
done
: > "$out/throughput.txt"
for ((round = 0; round < ROUNDS; round++)); do
  for who in ours deepspeed; do
    # shellcheck disable=SC2046
    "$launcher" --num_gpus 2 --master_port $((34000 + RANDOM % 2000)) $(job "$out/${who}_measure.json") \
      > "$out/${who}_measure_$round.log" 2>&1 || die "measuring $who's choice failed; see $out/${who}_measure_$round.log"
    python3 -c "import json; print('$who', json.load(open('$out/measure_metric.json'))['throughput'])" >> "$out/throughput.txt"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [l.split() for l in open(out + "/throughput.txt")]
med = {}
for who in ("ours", "deepspeed"):
    v = [float(x) for w, x in rows if w == who]
    med[who] = statistics.median(v)
    best = json.load(open(f"{out}/{who}_results/autotuning_results.json"))["best"]
    print(f"RESULT {who}_choice_throughput median={med[who]:.2f} min={min(v):.2f} max={max(v):.2f} n={len(v)} unit=samples/s choice={best}")
r = {k: json.load(open(f"{out}/{k}_results/autotuning_results.json")) for k in ("ours", "deepspeed")}
n = {k: len([e for e in r[k]["experiments"] if e["status"] != "pruned"]) for k in r}
print()
print("| | ours | DeepSpeed's search | ratio ours/DeepSpeed |")
print("|---|---|---|---|")
print(f"| experiments run | {n['ours']} | {n['deepspeed']} | {n['ours'] / n['deepspeed']:.2f} |")
print(f"| experiments to the best | {r['ours']['best_experiment_number']} | {r['deepspeed']['best_experiment_number']} | {r['ours']['best_experiment_number'] / r['deepspeed']['best_experiment_number']:.2f} |")
print(f"| time to the best (s) | {r['ours']['best_found_at_s']:.1f} | {r['deepspeed']['best_found_at_s']:.1f} | {r['ours']['best_found_at_s'] / r['deepspeed']['best_found_at_s']:.2f} |")
print(f"| whole tuning (s) | {r['ours']['tuning_s']:.1f} | {r['deepspeed']['tuning_s']:.1f} | {r['ours']['tuning_s'] / r['deepspeed']['tuning_s']:.2f} |")
print(f"| choice | {r['ours']['best']} | {r['deepspeed']['best']} | |")
print(f"| its throughput (samples/s, median) | {med['ours']:.2f} | {med['deepspeed']:.2f} | {med['ours'] / med['deepspeed']:.2f} |")
PY
