#!/usr/bin/env bash
# 16-bit master weights on 2 ranks: train_gpt in bf16 under ZeRO-2 with offload_optimizer "cpu"
# (CPU Adam) with fp32 masters, with bf16 masters (bf16_master_weights_and_grads) and with bf16
# masters and moments (bf16_optimizer_states), each against DeepSpeed 0.19.8 doing the same
# (bench/common/deepspeed_train_gpt.py with DeepSpeedCPUAdam; .venv-deepspeed-torch2: the
# feature is newer than the 0.15.4 peer). tokens/s, peak RSS per rank and the last loss, medians
# over the timed steps and rounds. Builds nothing; makes .venv-deepspeed-torch2
# (scripts/setup_deepspeed_peer.sh --torch2) when it is missing.
# Usage: bench/low_precision_masters/run.sh [MODEL FLAGS...]
#   default: --n_layer 8 --n_embd 512 (about 50M parameters, so that the 4 bytes per owned
#   element the masters save show beside the activations)
# Env: ROUNDS (3), STEPS (10), SKIP (3 warm-up steps not timed), CORPUS (data/austen.txt),
#      DS_VENV (.venv-deepspeed-torch2; none skips DeepSpeed), OUT_DIR (default a new /tmp dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model_flags=("$@")
[ ${#model_flags[@]} -eq 0 ] && model_flags=(--n_layer 8 --n_embd 512)
bench="low-precision masters"
tmp_prefix=low_precision_masters_bench
STEPS=${STEPS:-10}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
peer_setup_flags=--torch2
# shellcheck source=../common/train_gpt_bench_setup.sh
source bench/common/train_gpt_bench_setup.sh

# config(variant) -> path: the example config in bf16 under ZeRO-2 with CPU Adam offloaded;
# variant fp32 (fp32 masters), bf16 (bf16 masters) or bf16_states (and bf16 moments).
config() {
  local path="$out/ds_config_$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, variant = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(src))
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = 1
cfg["steps_per_print"] = 1000
cfg["zero_optimization"] = {"stage": 2, "reduce_bucket_size": 2000000,
                            "offload_optimizer": {"device": "cpu"}}
# DeepSpeedCPUAdam on the peer (its default here is torch's AdamW).
cfg["optimizer"]["params"]["torch_adam"] = False
cfg["bf16"] = {"enabled": True}
if variant != "fp32":
    cfg["bf16"]["bf16_master_weights_and_grads"] = True
if variant == "bf16_states":
    cfg["bf16"]["bf16_optimizer_states"] = True
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

fp32_cfg=$(config fp32)
bf16_cfg=$(config bf16)
bf16_states_cfg=$(config bf16_states)
# train_gpt writes the token cache the peer reads.
"$launcher" --num_gpus 1 "$ours" --deepspeed_config "$fp32_cfg" --data "$corpus" --steps 1 \
  --eval_batches 1 "${model_flags[@]}" > "$out/warmup.log" 2>&1 ||
  die "warm-up failed; see $out/warmup.log"
kinds=(fp32 bf16 bf16_states)
[ "$DS_VENV" != none ] && kinds+=(ds_fp32 ds_bf16 ds_bf16_states)
run_rotated_rounds "${kinds[@]}"

"$PY" bench/common/summarize_runs.py "$out" "$ROUNDS" "$SKIP" "${kinds[@]}" -- \
  "fp32/ds_fp32:fp32 masters, ours against DeepSpeed's" \
  "bf16/ds_bf16:bf16 masters, ours against DeepSpeed's" \
  "bf16_states/ds_bf16_states:bf16 masters and moments, ours against DeepSpeed's" \
  "bf16/fp32:bf16 masters against fp32 masters (ours)" \
  "bf16_states/fp32:bf16 masters and moments against fp32 masters (ours)" \
  "ds_bf16/ds_fp32:bf16 masters against fp32 masters (DeepSpeed)"
