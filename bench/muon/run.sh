#!/usr/bin/env bash
# The Muon optimizer on 2 ranks: train_gpt under ZeRO-2 (fp32) with optimizer.type "Muon" and
# with AdamW, each against DeepSpeed 0.19.8 doing the same (bench/common/deepspeed_train_gpt.py;
# .venv-deepspeed-torch2: 0.15.4 has no Muon). Both sides take Muon's halves by DeepSpeed's name
# rule on the same module names and run "gram" Newton-Schulz, in fp32 on this CPU on both sides
# (DeepSpeed's CPU accelerator takes fp16 for it only where oneDNN has fp16). DeepSpeed runs as a
# user would run it: its muon_update under torch.compile, its Adam half FusedAdam (a JIT op) or
# its inline fallback. tokens/s, peak RSS per rank and the last loss, medians over the timed
# steps and rounds, and the ratios: ours/DeepSpeed for each optimizer, Muon/AdamW on each side.
# Builds nothing; makes .venv-deepspeed-torch2 (scripts/setup_deepspeed_peer.sh --torch2) when
# it is missing.
# Usage: bench/muon/run.sh [MODEL FLAGS...]   (default: --n_layer 6 --n_embd 384)
# Env: ROUNDS (3), STEPS (12), SKIP (4 warm-up steps not timed: DeepSpeed compiles muon_update
#      in its first steps), CORPUS (data/austen.txt), DS_VENV (.venv-deepspeed-torch2; none skips
#      DeepSpeed), OUT_DIR (default a new /tmp dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model_flags=("$@")
[ ${#model_flags[@]} -eq 0 ] && model_flags=(--n_layer 6 --n_embd 384)
bench=muon
tmp_prefix=muon_bench
SKIP=${SKIP:-4}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed-torch2}
peer_setup_flags=--torch2
# shellcheck source=../common/train_gpt_bench_setup.sh
source bench/common/train_gpt_bench_setup.sh

# config(optimizer) -> path: the example config under ZeRO-2 with Muon or AdamW.
config() {
  local path="$out/ds_config_$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, optimizer = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(src))
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = 1
cfg["steps_per_print"] = 1000
cfg["zero_optimization"] = {"stage": 2, "reduce_bucket_size": 2000000}
if optimizer == "muon":
    # DeepSpeed's own Adam half (the peer script would otherwise pick torch's AdamW).
    cfg["optimizer"] = {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 6e-4,
                                                   "weight_decay": 0.1, "torch_adam": False}}
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

muon_cfg=$(config muon)
adamw_cfg=$(config adamw)
# train_gpt writes the token cache the peer reads.
"$launcher" --num_gpus 1 "$ours" --deepspeed_config "$adamw_cfg" --data "$corpus" --steps 1 \
  --eval_batches 1 "${model_flags[@]}" > "$out/warmup.log" 2>&1 ||
  die "warm-up failed; see $out/warmup.log"
kinds=(muon adamw)
[ "$DS_VENV" != none ] && kinds+=(ds_muon ds_adamw)
run_rotated_rounds "${kinds[@]}"

pairs=("muon/adamw:Muon against AdamW (ours)")
if [ "$DS_VENV" != none ]; then
  pairs=("muon/ds_muon:Muon, ours against DeepSpeed's"
         "adamw/ds_adamw:AdamW, ours against DeepSpeed's"
         "${pairs[@]}" "ds_muon/ds_adamw:Muon against AdamW (DeepSpeed)")
fi
"$PY" bench/common/summarize_runs.py "$out" "$ROUNDS" "$SKIP" "${kinds[@]}" -- "${pairs[@]}"
