#!/usr/bin/env bash
# Random-LTD's training speed-up: train_gpt on 2 ranks (ZeRO-1) without token dropping, and with
# random-LTD keeping 32 and 64 of each 128-token sequence in the middle blocks (1 and 2 of 4;
# DeepSpeed's recipe keeps the first and last layers whole), the kept length fixed for the run
# (require_steps far beyond it). tokens/s counts every token of the batch, so its ratio is the
# speed-up; the last loss shows what the dropping costs over so few steps. Ours only: DeepSpeed's
# random-LTD needs its CUDA kernels (RandomLTDBuilder). Builds nothing.
# Usage: bench/random_ltd/run.sh [MODEL FLAGS...]   default: --compact_vocab --n_embd 256 (the
#   example GPT's 4 blocks of 128 tokens, wider, with the corpus's own vocabulary so that the
#   blocks and not the 50257-word output projection take most of the time; --n_layer must stay 4)
# Env: ROUNDS (3), STEPS (12), SKIP (3 warm-up steps not timed), CORPUS (data/austen.txt),
#      OUT_DIR (default a new /tmp directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model_flags=("$@")
((${#model_flags[@]})) || model_flags=(--compact_vocab --n_embd 256)
bench="random-LTD"
tmp_prefix=random_ltd_bench
DS_VENV=none
# shellcheck source=../common/train_gpt_bench_setup.sh
source bench/common/train_gpt_bench_setup.sh

# config(kept) -> path: the example config under ZeRO-1, with random-LTD keeping `kept` tokens
# (0: off).
config() {
  local path="$out/ds_config_$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, kept = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(src))
cfg.pop("train_batch_size", None)
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = 1
cfg["steps_per_print"] = 1000
cfg["zero_optimization"] = {"stage": 1}
if kept:
    cfg["data_efficiency"] = {"enabled": True, "data_routing": {"enabled": True, "random_ltd": {
        "enabled": True, "total_layer_num": 4, "random_ltd_layer_num": 2,
        "random_ltd_layer_id": [1, 2], "model_mask_name": None, "model_type": "decoder",
        "hidden_state_order": "batch_seq_dim",
        "random_ltd_schedule": {"min_value": kept, "max_value": 128,
                                "schedule_type": "fixed_linear",
                                "schedule_config": {"require_steps": 1000000,
                                                    "seq_per_step": 16}}}}}
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

plain_cfg=$(config 0)
ltd32_cfg=$(config 32)
ltd64_cfg=$(config 64)
kinds=(plain ltd32 ltd64)
n=${#kinds[@]}
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order so that no kind always runs first on a warming machine.
  for i in $(seq 0 $((n - 1))); do
    k=${kinds[$(((i + r) % n))]}
    cfg_var="${k}_cfg"
    train_gpt_run "${k}_$r" 2 "${!cfg_var}" "$ours" --eval_batches 1
  done
done

"$PY" bench/common/summarize_runs.py "$out" "$ROUNDS" "$SKIP" "${kinds[@]}" -- \
  "ltd32/plain:keeping 32 of 128 tokens in blocks 1-2 against no dropping" \
  "ltd64/plain:keeping 64 of 128 tokens in blocks 1-2 against no dropping"
