#!/usr/bin/env bash
# AutoEP (expert_parallel) fine-tuning on 2 ranks, ours against DeepSpeed 0.19.8's: a random
# Qwen3-MoE (bench/auto_ep/make_qwen3_moe.py, transformers 5's layout) fine-tuned by
# finetune_llama and by transformers + deepspeed.initialize (bench/auto_ep/deepspeed_finetune.py,
# .venv-deepspeed-torch2), the same ds_config on both sides: autoep_size 2 (each rank holds half of
# every layer's experts, tokens sent by all-to-all), ZeRO-2 and ZeRO-3, AdamW (DeepSpeed's
# torch_adam: its CPU path). The sides run one after the other, ROUNDS rounds in alternating
# order; per side the median tokens/s over the steps after SKIP and the rounds, the peak RSS per
# rank, and the ratios ours / DeepSpeed. Builds nothing (build/bin/finetune_llama and the
# launcher come with scripts/build.sh); makes .venv-deepspeed-torch2 when missing.
# Env: HIDDEN (512), LAYERS (4), EXPERTS (16), MOE_FFN (512), MICRO (2), SEQ_LEN (128),
#      STEPS (8), SKIP (2), ROUNDS (2), STAGES ("2 3"), CORPUS (data/austen.txt), OUT_DIR,
#      DS_VENV (.venv-deepspeed-torch2)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
HIDDEN=${HIDDEN:-512}
LAYERS=${LAYERS:-4}
EXPERTS=${EXPERTS:-16}
MOE_FFN=${MOE_FFN:-512}
MICRO=${MICRO:-2}
SEQ_LEN=${SEQ_LEN:-128}
STEPS=${STEPS:-8}
SKIP=${SKIP:-2}
ROUNDS=${ROUNDS:-2}
STAGES=${STAGES:-"2 3"}
corpus=${CORPUS:-data/austen.txt}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
launcher=build/bin/deepspeed
ours=build/bin/finetune_llama
die() { echo "auto_ep bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; run scripts/build.sh"; done
[ -f "$corpus" ] || die "$corpus not found; run scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
bash scripts/setup_deepspeed_peer.sh --torch2 "$DS_VENV" >/dev/null ||
  die "scripts/setup_deepspeed_peer.sh --torch2 failed"
PY=$DS_VENV/bin/python

# Pinned environment (bench/README.md): one thread per rank on the 2 ranks.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo DS_ACCELERATOR=cpu
out=${OUT_DIR:-$(mktemp -d /tmp/auto_ep_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO auto_ep bench: hidden=$HIDDEN layers=$LAYERS experts=$EXPERTS moe_ffn=$MOE_FFN" \
     "micro=$MICRO seq_len=$SEQ_LEN steps=$STEPS skip=$SKIP rounds=$ROUNDS stages='$STAGES' out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo)," \
     "$(getconf _NPROCESSORS_ONLN) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"

model=$out/qwen3_moe
"$PY" bench/auto_ep/make_qwen3_moe.py "$corpus" "$model" "$HIDDEN" "$LAYERS" "$EXPERTS" \
  "$MOE_FFN" >"$out/make_model.log" 2>&1 || die "making the model failed; see $out/make_model.log"

for stage in $STAGES; do
  cat >"$out/zero$stage.json" <<JSON
{"train_micro_batch_size_per_gpu": $MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
 "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                           "weight_decay": 0.0, "torch_adam": true}},
 "zero_optimization": {"stage": $stage, "stage3_param_persistence_threshold": 0},
 "expert_parallel": {"enabled": true, "autoep_size": 2}}
JSON
done

port=$((29600 + RANDOM % 2000))
run() {  # run SIDE STAGE ROUND
  local side=$1 stage=$2 name="$1_zero$2_r$3"
  local cmd
  if [ "$side" = ours ]; then
    cmd=("$launcher" --num_gpus 2 --master_port "$port" "$ours" --eval_batches 1)
  else
    cmd=("$PY" -m torch.distributed.run --nproc_per_node 2 --master_port "$port"
         bench/auto_ep/deepspeed_finetune.py)
  fi
  port=$((port + 1))
  cmd+=(--model "$model" --deepspeed_config "$out/zero$stage.json" --data "$corpus"
        --steps "$STEPS" --seq_len "$SEQ_LEN" --metrics_file "$out/$name.jsonl")
  echo "INFO running $name"
  "${cmd[@]}" >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; die "$name failed"; }
}
for r in $(seq 1 "$ROUNDS"); do
  for stage in $STAGES; do
    if ((r % 2)); then run ours "$stage" "$r"; run deepspeed "$stage" "$r"
    else run deepspeed "$stage" "$r"; run ours "$stage" "$r"; fi
  done
done
grep -q "deepspeed: 0 AutoEPMoELayer" "$out"/deepspeed_*.log && die "DeepSpeed's AutoEP replaced no block"

"$PY" - "$out" "$SKIP" "$ROUNDS" $STAGES <<'PY'
import json, statistics, sys
out, skip, rounds, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {}
for stage in stages:
    for side in ("ours", "deepspeed"):
        tps, peak = [], 0.0
        for r in range(1, rounds + 1):
            lines = [json.loads(l) for l in open(f"{out}/{side}_zero{stage}_r{r}.jsonl")][skip:]
            tps += [l["tokens_per_s"] for l in lines]
            peak = max(peak, max(max(l["peak_rss_bytes"]) for l in lines) / 2**20)
        rows[(side, stage)] = (statistics.median(tps), peak)
        print(f"RESULT auto_ep.{side}.zero{stage}.tokens_per_s median={rows[(side, stage)][0]:.1f} "
              f"n={len(tps)} unit=tokens/s")
        print(f"RESULT auto_ep.{side}.zero{stage}.peak_rss_per_rank max={peak:.0f} unit=MiB")
print("\n| ZeRO stage (2 ranks, autoep_size 2) | ours tokens/s | DeepSpeed tokens/s | x DeepSpeed "
      "| ours peak RSS/rank (MiB) | DeepSpeed's | x DeepSpeed |")
print("|---|---|---|---|---|---|---|")
for stage in stages:
    (a, pa), (b, pb) = rows[("ours", stage)], rows[("deepspeed", stage)]
    print(f"| {stage} | {a:.0f} | {b:.0f} | {a / b:.2f} | {pa:.0f} | {pb:.0f} | {pa / pb:.2f} |")
PY
