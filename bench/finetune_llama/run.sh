#!/usr/bin/env bash
# Fine-tuning throughput and peak memory per rank of finetune_llama (real SmolLM2-135M, 2 ranks)
# under ZeRO-2, ZeRO-3 and ZeRO-3 + CPU offload of the optimizer, against the same fine-tuning
# with transformers + PyTorch DDP (bench/finetune_llama/hf_finetune.py, in the project's .venv).
# LoRA (deepspeed::linear, rank LORA_R on every decoder projection, the rest frozen) under
# ZeRO-2, with the frozen weights whole and sharded over the 2 ranks, against transformers +
# DDP with the same adapters. All runs start through our launcher, one after the other. Builds
# nothing; fetches the model and makes the .venv if missing. Prints RESULT lines and a table
# (median over the steps after SKIP). Env: STEPS (6), SKIP (2), SEQ_LEN (64), MICRO (2), LORA_R
# (16), SIDES (all: zero2 zero3 zero3_offload transformers lora lora_sharded transformers_lora),
# OUT_DIR, RUN_TIMEOUT_S (1800).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
STEPS=${STEPS:-6}
SKIP=${SKIP:-2}
SEQ_LEN=${SEQ_LEN:-64}
MICRO=${MICRO:-2}
LORA_R=${LORA_R:-16}
SIDES=${SIDES:-zero2 zero3 zero3_offload transformers lora lora_sharded transformers_lora}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-1800}
model=data/SmolLM2-135M-Instruct.Q4_1.gguf
corpus=data/austen.txt
launcher=build/bin/deepspeed
ours=build/bin/finetune_llama
die() { echo "finetune_llama bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; run scripts/build.sh"; done
[ -f "$corpus" ] || die "$corpus not found; run scripts/fetch_corpus.sh"
bash scripts/fetch_smollm2.sh >/dev/null
bash scripts/setup_python_refs.sh >/dev/null
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"

source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=${OUT_DIR:-$(mktemp -d /tmp/finetune_llama_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO finetune_llama bench: steps=$STEPS skip=$SKIP seq_len=$SEQ_LEN micro=$MICRO out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo), $(getconf _NPROCESSORS_ONLN) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"

config() {  # config NAME ZERO_JSON
  cat >"$out/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": $MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
 "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
 "zero_optimization": $2}
JSON
}
config zero2 '{"stage": 2, "reduce_bucket_size": 20000000, "allgather_bucket_size": 20000000}'
config zero3 '{"stage": 3, "reduce_bucket_size": 20000000, "stage3_prefetch_bucket_size": 20000000}'
config zero3_offload '{"stage": 3, "reduce_bucket_size": 20000000, "stage3_prefetch_bucket_size": 20000000, "offload_optimizer": {"device": "cpu"}}'
config transformers '{"stage": 0}'
config lora '{"stage": 2, "reduce_bucket_size": 20000000, "allgather_bucket_size": 20000000}'
cp "$out/lora.json" "$out/lora_sharded.json"
cp "$out/transformers.json" "$out/transformers_lora.json"

port=$((29600 + RANDOM % 2000))
for side in $SIDES; do
  cmd=("$launcher" --num_gpus 2 --master_port "$port")
  port=$((port + 1))
  case "$side" in
    transformers*) cmd+=(.venv/bin/python bench/finetune_llama/hf_finetune.py) ;;
    *) cmd+=("$ours" --eval_batches 1) ;;
  esac
  case "$side" in
    lora | transformers_lora) cmd+=(--lora_r "$LORA_R") ;;
    lora_sharded) cmd+=(--lora_r "$LORA_R" --lora_base_weight_sharding 2) ;;
  esac
  cmd+=(--model "$model" --deepspeed_config "$out/$side.json" --data "$corpus" --steps "$STEPS"
        --seq_len "$SEQ_LEN" --metrics_file "$out/$side.jsonl")
  echo "INFO running $side: ${cmd[*]}"
  timeout "$RUN_TIMEOUT_S" "${cmd[@]}" >"$out/$side.log" 2>&1 || { tail -20 "$out/$side.log" >&2; die "$side failed"; }
done
.venv/bin/python - "$out" "$SKIP" $SIDES <<'PY'
import json, statistics, sys
out, skip, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for side in sides:
    lines = [json.loads(l) for l in open(f"{out}/{side}.jsonl")][skip:]
    tps = statistics.median(r["tokens_per_s"] for r in lines)
    peak = max(max(r["peak_rss_bytes"]) for r in lines) / 2**20
    rows[side] = (tps, peak)
    print(f"RESULT finetune_llama.{side}.tokens_per_s median={tps:.1f} n={len(lines)} unit=tokens/s")
    print(f"RESULT finetune_llama.{side}.peak_rss_per_rank max={peak:.0f} unit=MiB")
print(f"\n| run (2 ranks) | tokens/s | x transformers | peak RSS per rank (MiB) | x transformers |")
print("|---|---|---|---|---|")
for side, (tps, peak) in rows.items():
    # LoRA runs against transformers with the same adapters, the others against full DDP.
    peer = "transformers_lora" if side.startswith("lora") else "transformers"
    base = rows.get(peer, (float("nan"), float("nan")))
    print(f"| {side} | {tps:.0f} | {tps / base[0]:.2f} | {peak:.0f} | {peak / base[1]:.2f} |")
PY
