# Sourced by the benches that run train_gpt against bench/common/deepspeed_train_gpt.py on one
# machine (zero3_variants, sequence_parallel) once they have set `bench` (a name for messages),
# `tmp_prefix` and `model_flags` (and `peer_setup_flags`, --torch2 for the DeepSpeed 0.19.8 peer,
# if it needs that one). Reads ROUNDS, STEPS, SKIP, CORPUS, DS_VENV and OUT_DIR as the
# scripts document; checks the binaries, corpus and step counts; makes the DeepSpeed peer's
# virtual environment unless DS_VENV is none; pins the environment (bench/README.md); sets PY,
# launcher, ours, peer, corpus, DS_VENV, out and die().
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-12}
SKIP=${SKIP:-3}
PY=/usr/bin/python3
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
peer=bench/common/deepspeed_train_gpt.py
corpus=${CORPUS:-data/austen.txt}
DS_VENV=${DS_VENV:-$root/.venv-deepspeed}
die() { echo "$bench bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; build it first"; done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
if [ "$DS_VENV" != none ]; then
  # shellcheck disable=SC2086  # peer_setup_flags: empty or --torch2, set by the bench
  bash scripts/setup_deepspeed_peer.sh ${peer_setup_flags:-} "$DS_VENV" >/dev/null ||
    die "scripts/setup_deepspeed_peer.sh failed"
fi
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo DS_ACCELERATOR=cpu
out=${OUT_DIR:-$(mktemp -d "/tmp/$tmp_prefix.XXXXXX")}
mkdir -p "$out"
echo "INFO $bench bench: rounds=$ROUNDS steps=$STEPS skip=$SKIP model_flags='${model_flags[*]}'" \
  "out=$out load=$(cut -d' ' -f1-3 /proc/loadavg)"

# train_gpt_run NAME RANKS CONFIG PROGRAM [ARGS...]: PROGRAM (train_gpt, or a Python and the peer
# script) over RANKS local ranks with CONFIG, the corpus, STEPS and model_flags; metrics in
# $out/NAME.jsonl, output in $out/NAME.log; dies naming the log when the run fails.
train_gpt_run() {
  local name=$1 ranks=$2 cfg=$3
  shift 3
  "$launcher" --num_gpus "$ranks" --master_port $((29600 + RANDOM % 300)) "$@" \
    --deepspeed_config "$cfg" --data "$corpus" --steps "$STEPS" \
    --metrics_file "$out/$name.jsonl" "${model_flags[@]}" > "$out/$name.log" 2>&1 ||
    die "$name failed; see $out/$name.log"
}

# run_rotated_rounds KIND...: ROUNDS rounds of every kind on 2 ranks, named KIND_ROUND, the order
# rotated each round so that no kind always runs first on a warming machine. A kind ds_X runs
# the DeepSpeed peer with the config path in $X_cfg; any other kind X runs train_gpt with $X_cfg.
run_rotated_rounds() {
  local kinds=("$@") n=$# r i k cfg_var
  for r in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
      k=${kinds[$(((i + r) % n))]}
      if [[ $k == ds_* ]]; then
        cfg_var="${k#ds_}_cfg"
        train_gpt_run "${k}_$r" 2 "${!cfg_var}" "$DS_VENV/bin/python" "$peer"
      else
        cfg_var="${k}_cfg"
        train_gpt_run "${k}_$r" 2 "${!cfg_var}" "$ours" --eval_batches 1
      fi
    done
  done
}
