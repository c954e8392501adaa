#!/usr/bin/env bash
# The hybrid engine's generation under ZeRO-3: finetune_llama (the real SmolLM2-135M, 2 ranks,
# examples/finetune_llama/ds_config.json) generating TOKENS greedy tokens with a KV cache, with
# and without hybrid_engine (pin_parameters: every layer gathered once per generation instead of
# once per token). Rounds interleave the two; prints the medians of finetune_llama's own
# generation time and the ratio. Ours only: DeepSpeed's hybrid engine needs its CUDA inference
# kernels. Builds nothing; fetches the model (scripts/fetch_smollm2.sh) if missing.
# Env: ROUNDS (3), TOKENS (32), OUT_DIR (a new /tmp directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-32}
die() { echo "hybrid_engine bench: $*" >&2; exit 1; }
for bin in build/bin/deepspeed build/bin/finetune_llama; do
  [ -x "$bin" ] || die "$bin not found; build it first (scripts/build.sh)"
done
bash scripts/fetch_smollm2.sh >/dev/null || die "scripts/fetch_smollm2.sh failed"
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo DS_ACCELERATOR=cpu
out=${OUT_DIR:-$(mktemp -d /tmp/hybrid_engine_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO hybrid_engine bench: rounds=$ROUNDS tokens=$TOKENS out=$out" \
  "load=$(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - examples/finetune_llama/ds_config.json "$out" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
json.dump(c, open(f"{sys.argv[2]}/plain.json", "w"))
c["hybrid_engine"] = {"enabled": True, "pin_parameters": True}
json.dump(c, open(f"{sys.argv[2]}/hybrid.json", "w"))
PYEOF

for ((r = 1; r <= ROUNDS; r++)); do
  for mode in plain hybrid; do
    log="$out/round$r-$mode.log"
    build/bin/deepspeed --num_gpus 2 --master_port $((29600 + RANDOM % 300)) \
      build/bin/finetune_llama --deepspeed_config "$out/$mode.json" --steps 0 \
      --prompt "It is a truth universally acknowledged" --max_new_tokens "$TOKENS" \
      --generation_file "$out/round$r-$mode.json" > "$log" 2>&1 || die "$mode failed; see $log"
    line=$(grep -o 'generated [0-9]* tokens in [0-9.]* s' "$log") || die "no timing in $log"
    echo "$mode $line" >> "$out/results.txt"
    echo "INFO round $r $mode: $line"
  done
  cmp -s "$out/round$r-plain.json" "$out/round$r-hybrid.json" ||
    die "round $r: the two generations differ ($out/round$r-*.json)"
done

/usr/bin/python3 - "$out/results.txt" <<'PYEOF'
import statistics, sys
secs = {}
for line in open(sys.argv[1]):
    mode, _, tokens, _, _, s, _ = line.split()
    secs.setdefault(mode, []).append(float(s))
    n = int(tokens)
for mode, v in sorted(secs.items()):
    print(f"RESULT {mode}_generation_s median={statistics.median(v):.3f} min={min(v):.3f} "
          f"max={max(v):.3f} n={len(v)} unit=s")
p, h = statistics.median(secs["plain"]), statistics.median(secs["hybrid"])
print("| ZeRO-3, 2 ranks | generation (s) | tokens/s | vs. without |")
print("| --- | --- | --- | --- |")
print(f"| without hybrid_engine | {p:.3f} | {n / p:.2f} | 1.00x |")
print(f"| hybrid_engine, pin_parameters | {h:.3f} | {n / h:.2f} | {p / h:.2f}x |")
PYEOF
