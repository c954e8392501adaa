#!/usr/bin/env bash
# Sequence parallelism (DeepSpeed-Ulysses) on 2 ranks: one long sequence per step, its tokens
# split over the 2 ranks (train_gpt with "sequence_parallel_size": 2), against DeepSpeed's own
# Ulysses (0.15.4 on the same python3-torch: the same GPT, windows and ds_config, attention
# through deepspeed.sequence's DistributedAttention; bench/common/deepspeed_train_gpt.py) and
# against one rank training the whole sequence alone; plus 2 data-parallel ranks on one
# sequence each (twice the tokens per step) for scale. tokens/s, peak RSS per rank and bytes
# sent per rank per step (ours), medians over the timed steps and rounds. Builds nothing; makes
# .venv-deepspeed (scripts/setup_deepspeed_peer.sh) when it is missing.
# Usage: bench/sequence_parallel/run.sh [MODEL FLAGS...]   default --seq_len 1024
# Env: ROUNDS (3), STEPS (12), SKIP (3 warm-up steps not timed), CORPUS (data/austen.txt),
#      DS_VENV (.venv-deepspeed; none skips DeepSpeed), OUT_DIR (default a new /tmp directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model_flags=("$@")
((${#model_flags[@]})) || model_flags=(--seq_len 1024)
bench="sequence parallel"
tmp_prefix=sp_bench
# shellcheck source=../common/train_gpt_bench_setup.sh
source bench/common/train_gpt_bench_setup.sh

# config(sp) -> path: the example config, one sequence per micro-batch, no accumulation.
config() {
  local path="$out/ds_config_sp$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, sp = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(src))
cfg.pop("train_batch_size", None)
cfg["train_micro_batch_size_per_gpu"] = 1
cfg["gradient_accumulation_steps"] = 1
cfg["steps_per_print"] = 1000
if sp > 1:
    cfg["sequence_parallel_size"] = sp
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

run() { train_gpt_run "$@" --compact_vocab; }  # run NAME RANKS CONFIG PROGRAM...

sp_cfg=$(config 2)
plain_cfg=$(config 1)
# train_gpt writes the token cache the peer reads.
run warmup 1 "$plain_cfg" "$ours" --eval_batches 1
kinds=(sp one dp)
[ "$DS_VENV" != none ] && kinds+=(ds_sp)
n=${#kinds[@]}
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order so that no kind always runs first on a warming machine.
  for i in $(seq 0 $((n - 1))); do
    k=${kinds[$(((i + r) % n))]}
    case $k in
      sp) run "sp_$r" 2 "$sp_cfg" "$ours" --eval_batches 1 ;;
      one) run "one_$r" 1 "$plain_cfg" "$ours" --eval_batches 1 ;;
      dp) run "dp_$r" 2 "$plain_cfg" "$ours" --eval_batches 1 ;;
      ds_sp) run "ds_sp_$r" 2 "$sp_cfg" "$DS_VENV/bin/python" "$peer" ;;
    esac
  done
done

"$PY" bench/common/summarize_runs.py "$out" "$ROUNDS" "$SKIP" "${kinds[@]}" -- \
  "sp/ds_sp:ours against DeepSpeed-Ulysses" \
  "sp/one:one sequence split over 2 ranks against one rank alone" \
  "sp/dp:against 2 data-parallel ranks, each on a whole sequence"
