#!/usr/bin/env bash
# Bytes per step, tokens/s and loss curves of train_gpt with Adam vs 1-bit Adam vs 0/1 Adam
# (DeepSpeed's optimizer types, ZeRO stage 0, fp32) on 2 and 4 ranks:
#   1. over loopback (the launcher on this machine), and
#   2. across a bandwidth-limited link: two network namespaces joined by a veth pair whose both
#      ends are shaped with tc netem (RATE, default 10mbit, DELAY 1ms; tc tbf at RATE where the
#      kernel has no netem qdisc); half of the ranks in each
#      namespace, started directly with RANK/WORLD_SIZE/MASTER_ADDR (no sshd needed). Needs root.
# Prints one table per setting (report.py) and writes loss-curve PNGs (gnuplot) into OUT_DIR.
# Builds nothing: build train_gpt and the launcher first (scripts/build.sh).
# Usage: bench/onebit/run.sh [MODEL FLAGS...]   default: --n_layer 2 --n_head 2 --n_embd 64
# Env: STEPS (60), FREEZE (20: freeze_step / var_freeze_step), RANKS ("2 4"), RATE (10mbit),
#      DELAY (1ms), NETEM (1: also run the shaped-link part; 0 skips it), CORPUS
#      (tests/data/austen_slice.txt), OUT_DIR (default a new /tmp/onebit_bench.* directory),
#      VOCAB (compact: --compact_vocab, the corpus's own tokens as a small dense embedding, where
#      the 1-bit curves converge like Adam's; full: GPT-2's 50257-token vocabulary, where 1-bit
#      Adam diverges after the freeze; mask: the full vocabulary with train_gpt --exp_avg_mask,
#      DeepSpeed's momentum mask on the rows the corpus never uses, which does not prevent that
#      divergence; docs/onebit.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
STEPS=${STEPS:-60}
FREEZE=${FREEZE:-20}
RANKS=${RANKS:-"2 4"}
RATE=${RATE:-10mbit}
DELAY=${DELAY:-1ms}
NETEM=${NETEM:-1}
CORPUS=${CORPUS:-tests/data/austen_slice.txt}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/onebit_bench.XXXXXX)}
VOCAB=${VOCAB:-compact}
case "$VOCAB" in
  mask) vocab_flags=(--exp_avg_mask) ;;
  compact) vocab_flags=(--compact_vocab) ;;
  full) vocab_flags=() ;;
  *) echo "onebit bench: VOCAB must be mask, compact or full (got $VOCAB)" >&2; exit 1 ;;
esac
model_flags=("$@")
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OPENBLAS_NUM_THREADS=1
[ ${#model_flags[@]} -gt 0 ] || model_flags=(--n_layer 2 --n_head 2 --n_embd 64)
launcher=build/bin/deepspeed
train=build/bin/train_gpt
for bin in "$launcher" "$train"; do
  [ -x "$bin" ] || { echo "onebit bench: $bin not found; build it first" >&2; exit 1; }
done
mkdir -p "$OUT_DIR"
# train_gpt caches the tokens next to the corpus: keep that out of the checkout.
cp "$CORPUS" "$OUT_DIR/corpus.txt"
CORPUS=$OUT_DIR/corpus.txt

write_config() {  # name ranks -> OUT_DIR/name_ranks.json (a global batch of 4 sequences)
  local opt
  case "$1" in
    adam) opt='{"type": "Adam", "params": {"lr": 2e-3, "bias_correction": false}}' ;;
    onebitadam) opt="{\"type\": \"OneBitAdam\", \"params\": {\"lr\": 2e-3, \"freeze_step\": $FREEZE}}" ;;
    zerooneadam) opt="{\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 2e-3, \"var_freeze_step\": $FREEZE, \"var_update_scaler\": 4, \"local_step_scaler\": 8, \"local_step_clipper\": 4}}" ;;
  esac
  cat > "$OUT_DIR/$1_$2.json" <<JSON
{"train_micro_batch_size_per_gpu": $((4 / $2)), "steps_per_print": 1000, "gradient_clipping": 1.0, "optimizer": $opt}
JSON
}
optimizers=(adam onebitadam zerooneadam)
for n in $RANKS; do for o in "${optimizers[@]}"; do write_config "$o" "$n"; done; done
train_args() {  # optimizer config metrics
  local flags=("${vocab_flags[@]}")
  # exp_avg_mask is a 1-bit optimizers' key: Adam trains the same full-vocabulary model without.
  [ "$1" = adam ] && [ "$VOCAB" = mask ] && flags=()
  echo --deepspeed_config "$2" --data "$CORPUS" --steps "$STEPS" --seq_len 32 --eval_batches 1 \
    --metrics_file "$3" "${flags[@]}" "${model_flags[@]}"
}

echo "== loopback (launcher on this machine) =="
for n in $RANKS; do
  for o in "${optimizers[@]}"; do
    m="$OUT_DIR/loopback_${n}_$o.jsonl"
    GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 "$launcher" --num_gpus "$n" --master_port $((29900 + RANDOM % 500)) \
      "$train" $(train_args "$o" "$OUT_DIR/${o}_$n.json" "$m") > "$OUT_DIR/loopback_${n}_$o.log" 2>&1 ||
      { echo "run failed: see $OUT_DIR/loopback_${n}_$o.log" >&2; exit 1; }
  done
  python3 bench/onebit/report.py --title "loopback, $n ranks, vocabulary: $VOCAB" --freeze "$FREEZE" \
    --png "$OUT_DIR/loss_loopback_${n}.png" "${optimizers[@]/#/$OUT_DIR/loopback_${n}_}"
done

[ "$NETEM" = 1 ] || exit 0
if [ "$(id -u)" -ne 0 ] || ! ip netns add dsonebitprobe$$ 2>/dev/null; then
  echo "SKIP shaped link: needs root and network namespaces"; exit 0
fi
ip netns del dsonebitprobe$$
echo "== two network namespaces, veth shaped to $RATE (tc netem, $DELAY delay; tbf where netem is missing) =="
tag="dob$$"; ns_a="${tag}a"; ns_b="${tag}b"; if_a="${tag}va"; if_b="${tag}vb"
ip_a=10.231.$(( $$ % 250 + 1 )).1; ip_b=${ip_a%.1}.2
cleanup() {
  set +e
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "$if_a" 2>/dev/null
}
trap cleanup EXIT
ip netns add "$ns_a"; ip netns add "$ns_b"
ip link add "$if_a" type veth peer name "$if_b"
ip link set "$if_a" netns "$ns_a"; ip link set "$if_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "$if_a"; ip -n "$ns_b" addr add "$ip_b/24" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$if_a" up; ip -n "$ns_b" link set "$if_b" up
shape() {  # ns if: netem (rate + delay); without the sch_netem module, tbf (rate only)
  ip netns exec "$1" tc qdisc add dev "$2" root netem rate "$RATE" delay "$DELAY" 2>/dev/null ||
    { ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 64kb latency 50ms &&
      echo "INFO no netem qdisc in this kernel: shaped with tbf to $RATE, no added delay"; }
}
shape "$ns_a" "$if_a"
shape "$ns_b" "$if_b"
for n in $RANKS; do
  for o in "${optimizers[@]}"; do
    m="$OUT_DIR/netem_${n}_$o.jsonl"
    port=$((31000 + RANDOM % 500))
    pids=()
    for ((r = 0; r < n; r++)); do
      # The first half of the ranks on host a (which also holds the store), the rest on b.
      if ((r < n / 2)); then ns=$ns_a; ifname=$if_a; local_rank=$r
      else ns=$ns_b; ifname=$if_b; local_rank=$((r - n / 2)); fi
      metrics_arg=/dev/null; ((r == 0)) && metrics_arg=$m
      ip netns exec "$ns" env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=$ifname RANK=$r WORLD_SIZE=$n LOCAL_RANK=$local_rank \
        LOCAL_WORLD_SIZE=$((n / 2)) MASTER_ADDR=$ip_a MASTER_PORT=$port \
        "$train" $(train_args "$o" "$OUT_DIR/${o}_$n.json" "$metrics_arg") \
        > "$OUT_DIR/netem_${n}_${o}_rank$r.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || { echo "run failed: see $OUT_DIR/netem_${n}_${o}_rank*.log" >&2; exit 1; }
    done
  done
  python3 bench/onebit/report.py --title "$RATE link between 2 namespaces, $n ranks, vocabulary: $VOCAB" \
    --freeze "$FREEZE" --png "$OUT_DIR/loss_netem_${n}.png" "${optimizers[@]/#/$OUT_DIR/netem_${n}_}"
done
echo "outputs in $OUT_DIR"
