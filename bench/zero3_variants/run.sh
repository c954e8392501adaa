#!/usr/bin/env bash
# ZeRO-3's variants on 4 ranks: train_gpt under plain ZeRO-3, MiCS ("mics_shard_size": 2, two
# shard groups of two ranks, replicas of each other) and ZeRO++'s hpZ
# ("zero_hpz_partition_size": 2, secondary partitions over pairs of ranks), each against
# DeepSpeed 0.15.4 doing the same (bench/common/deepspeed_train_gpt.py: the same GPT, windows
# and ds_config; .venv-deepspeed); then ZeRO++'s qwZ ("zero_quantized_weights") and qgZ
# ("zero_quantized_gradients", the 4 ranks as 2 nodes of 2 through NDEV_PER_NODE), and qgZ with
# LoCo's error feedback ("zeropp_loco_param"), ours only: DeepSpeed's quantizer has no CPU
# kernel. tokens/s, peak RSS per rank, bytes sent per rank per step (ours) and the last loss,
# medians over the timed steps and rounds. Builds nothing; makes .venv-deepspeed
# (scripts/setup_deepspeed_peer.sh) when it is missing.
# Usage: bench/zero3_variants/run.sh [MODEL FLAGS...]   default: the example GPT, micro-batch 4
# Env: ROUNDS (3), STEPS (12), SKIP (3 warm-up steps not timed), CORPUS (data/austen.txt),
#      DS_VENV (.venv-deepspeed; none skips DeepSpeed), OUT_DIR (default a new /tmp directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model_flags=("$@")
bench="zero3 variants"
tmp_prefix=zero3_variants_bench
# shellcheck source=../common/train_gpt_bench_setup.sh
source bench/common/train_gpt_bench_setup.sh

# config(variant) -> path: the example config under ZeRO-3, plain, mics, hpz, qwz, qgz or loco.
config() {
  local path="$out/ds_config_$1.json"
  "$PY" - examples/train_gpt/ds_config.json "$path" "$1" <<'PYEOF'
import json, sys
src, dst, variant = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(src))
cfg.pop("train_batch_size", None)
cfg["train_micro_batch_size_per_gpu"] = 4
cfg["gradient_accumulation_steps"] = 1
cfg["steps_per_print"] = 1000
# Released after each use, as a model too large to stay gathered from its forward to its
# backward is: the backward gathers again (hpZ's secondary partitions serve those gathers).
cfg["zero_optimization"] = {"stage": 3, "reduce_bucket_size": 2000000,
                            "stage3_param_persistence_threshold": 0,
                            "stage3_max_reuse_distance": 0}
if variant == "mics":
    cfg["zero_optimization"]["mics_shard_size"] = 2
if variant == "hpz":
    cfg["zero_optimization"]["zero_hpz_partition_size"] = 2
if variant == "qwz":
    cfg["zero_optimization"]["zero_quantized_weights"] = True
if variant in ("qgz", "loco"):
    cfg["zero_optimization"]["zero_quantized_gradients"] = True
if variant == "loco":
    cfg["zero_optimization"]["zeropp_loco_param"] = {"err_beta": 0.8, "reset_T": 1024}
json.dump(cfg, open(dst, "w"), indent=2)
PYEOF
  echo "$path"
}

run() { train_gpt_run "$1" 4 "${@:2}"; }  # run NAME CONFIG PROGRAM...

zero3_cfg=$(config zero3)
mics_cfg=$(config mics)
hpz_cfg=$(config hpz)
qwz_cfg=$(config qwz)
qgz_cfg=$(config qgz)
loco_cfg=$(config loco)
# train_gpt writes the token cache the peer reads.
"$launcher" --num_gpus 1 "$ours" --deepspeed_config "$zero3_cfg" --data "$corpus" --steps 1 \
  --eval_batches 1 > "$out/warmup.log" 2>&1 || die "warm-up failed; see $out/warmup.log"
kinds=(zero3 mics hpz qwz qgz loco)
[ "$DS_VENV" != none ] && kinds+=(ds_zero3 ds_mics ds_hpz)
n=${#kinds[@]}
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order so that no kind always runs first on a warming machine.
  for i in $(seq 0 $((n - 1))); do
    k=${kinds[$(((i + r) % n))]}
    case $k in
      qgz | loco)  # two "nodes" of two ranks: qgZ does nothing on one node
        cfg_var="${k}_cfg"
        NDEV_PER_NODE=2 run "${k}_$r" "${!cfg_var}" "$ours" --eval_batches 1 ;;
      zero3 | mics | hpz | qwz)
        cfg_var="${k}_cfg"
        run "${k}_$r" "${!cfg_var}" "$ours" --eval_batches 1 ;;
      ds_*)
        cfg_var="${k#ds_}_cfg"
        run "${k}_$r" "${!cfg_var}" "$DS_VENV/bin/python" "$peer" ;;
    esac
  done
done

"$PY" bench/common/summarize_runs.py "$out" "$ROUNDS" "$SKIP" "${kinds[@]}" -- \
  "zero3/ds_zero3:plain ZeRO-3, ours against DeepSpeed's" \
  "mics/ds_mics:MiCS, ours against DeepSpeed's" \
  "hpz/ds_hpz:hpZ, ours against DeepSpeed's" \
  "mics/zero3:shard groups of 2 against ZeRO-3 over 4 ranks" \
  "hpz/zero3:secondary partitions of 2 against ZeRO-3 over 4 ranks" \
  "qwz/zero3:int8 weight gathers against ZeRO-3's fp32" \
  "qgz/zero3:4-bit all-to-all gradient reduction against ZeRO-3's all-reduce" \
  "loco/qgz:qgZ with LoCo's error feedback against qgZ alone" \
  "loco/zero3:qgZ with LoCo against ZeRO-3's all-reduce"
