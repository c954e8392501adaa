#!/usr/bin/env bash
# The main job: installs what is missing, builds, fetches the corpus (Jane Austen's novels from
# Debian's r-cran-janeaustenr), and trains the example GPT over 2 local ranks with ZeRO-0.
# Extra arguments go to train_gpt, e.g. `scripts/train.sh --steps 50`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
"$root/scripts/fetch_corpus.sh" "$root/data/austen.txt"
# CPU speed settings (bench/README.md): OpenBLAS's kernels for this CPU (not the machines' forced
# Haswell; where OpenBLAS falls back to generic ones, the library selects the CPU's: docs/env.md),
# one thread per rank.
unset OPENBLAS_CORETYPE
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
build=${DS_BUILD_DIR:-$root/build}
# 200 steps unless the caller gives --steps (train_gpt takes each option once).
steps=(--steps 200)
for arg in "$@"; do [[ $arg == --steps || $arg == --steps=* ]] && steps=(); done
exec "$build/bin/deepspeed" --num_gpus "${NUM_RANKS:-2}" "$build/bin/train_gpt" \
  --deepspeed_config "$root/examples/train_gpt/ds_config.json" \
  --data "$root/data/austen.txt" \
  "${steps[@]}" --metrics_file "$build/train_gpt_metrics.jsonl" "$@"
