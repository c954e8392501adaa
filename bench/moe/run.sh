#!/usr/bin/env bash
# MoE GPT against its dense base on 2 ranks: train_gpt with every MOE_EVERY-th block's MLP an
# MoE layer of MOE_EXPERTS experts (top-MOE_K, expert-parallel over the 2 ranks) against the same
# GPT with dense MLPs, same data, batch and steps. Prints, per side, the median tokens/s, the
# peak RSS per rank, the parameters, the training LM loss after N steps, the held-out loss, and
# the MoE side's loss when it has spent the dense side's wall time (the equal-time budget).
# Builds nothing. Usage: bench/moe/run.sh [MODEL FLAGS...]
# Env: ROUNDS (2), STEPS (60), SKIP (3 warm-up steps not timed), MOE_EXPERTS (8), MOE_K (2),
#      MOE_EVERY (2), MOE_EP (2), CORPUS (data/austen.txt), OUT_DIR (a new /tmp directory),
#      DS_CONFIG (examples/train_gpt/ds_config.json; any ZeRO stage 0-2, fp32/bf16, for both sides).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-60}
SKIP=${SKIP:-3}
MOE_EXPERTS=${MOE_EXPERTS:-8}
MOE_K=${MOE_K:-2}
MOE_EVERY=${MOE_EVERY:-2}
MOE_EP=${MOE_EP:-2}
PY=/usr/bin/python3
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
corpus=${CORPUS:-data/austen.txt}
ds_config=${DS_CONFIG:-examples/train_gpt/ds_config.json}
model_flags=("$@")
die() { echo "moe bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do [ -x "$bin" ] || die "$bin not found; build it first"; done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"
# Pinned environment (bench/README.md).
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=${OUT_DIR:-$(mktemp -d /tmp/moe_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO moe bench: rounds=$ROUNDS steps=$STEPS experts=$MOE_EXPERTS top_k=$MOE_K every=$MOE_EVERY ep_size=$MOE_EP config=$ds_config model_flags='${model_flags[*]}' out=$out load=$(cut -d' ' -f1-3 /proc/loadavg)"

moe_flags=(--moe_num_experts "$MOE_EXPERTS" --moe_top_k "$MOE_K" --moe_every "$MOE_EVERY"
           --moe_ep_size "$MOE_EP" --moe_capacity_factor 1.0 --moe_aux_loss_coef 0.01)
run() {  # run NAME [EXTRA FLAGS...]
  local name=$1; shift
  "$launcher" --num_gpus 2 --master_port $((29600 + RANDOM % 300)) "$ours" \
    --deepspeed_config "$ds_config" --data "$corpus" --steps "$STEPS" \
    --eval_batches 4 --compact_vocab --metrics_file "$out/$name.jsonl" "${model_flags[@]}" "$@" \
    > "$out/$name.log" 2>&1 || die "$name failed; see $out/$name.log"
}
for r in $(seq 1 "$ROUNDS"); do
  if ((r % 2)); then run "dense_$r"; run "moe_$r" "${moe_flags[@]}"
  else run "moe_$r" "${moe_flags[@]}"; run "dense_$r"; fi
done

"$PY" - "$out" "$ROUNDS" "$SKIP" <<'PYEOF'
import json, re, statistics, sys
out, rounds, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
def log(name):
    return open(f"{out}/{name}.log").read()
res = {}
for kind in ("dense", "moe"):
    tps, peak, lm, held, params, times = [], [], [], [], None, []
    for r in range(1, rounds + 1):
        rs = rows(f"{kind}_{r}")
        tps.append(statistics.median(x["tokens_per_s"] for x in rs[skip:]))
        peak.append(max(max(x["peak_rss_bytes"]) for x in rs) / 2**20)
        # The LM loss: the engine's loss less the aux term the MoE side adds (coef 0.01).
        lm.append(rs[-1]["loss"] - 0.01 * rs[-1].get("moe_aux_loss", 0.0))
        m = re.search(r"held-out loss ([0-9.]+) -> ([0-9.]+)", log(f"{kind}_{r}"))
        held.append(float(m.group(2)) if m else float("nan"))
        m = re.search(r"([0-9]+) params", log(f"{kind}_{r}"))
        params = int(m.group(1)) if m else -1
        t, curve = 0.0, []
        for x in rs:
            t += x["step_time_s"]
            curve.append((t, x["loss"] - 0.01 * x.get("moe_aux_loss", 0.0)))
        times.append(curve)
    res[kind] = dict(tps=tps, peak=peak, lm=lm, held=held, params=params, curves=times)
    for key, unit in (("tps", "tokens/s"), ("peak", "MiB"), ("lm", "loss"), ("held", "loss")):
        v = res[kind][key]
        print(f"RESULT moe_bench_{kind}_{key} median={statistics.median(v):.4f} min={min(v):.4f} "
              f"max={max(v):.4f} n={len(v)} unit={unit}")
# Equal time budget: the MoE side's LM loss at the step where its elapsed time reaches the
# dense run's total time (each round paired).
budget = []
for d, m in zip(res["dense"]["curves"], res["moe"]["curves"]):
    t_dense = d[-1][0]
    reached = [l for t, l in m if t <= t_dense]
    budget.append(reached[-1] if reached else float("nan"))
print(f"RESULT moe_bench_moe_lm_at_dense_time median={statistics.median(budget):.4f} n={len(budget)} unit=loss")
md = lambda k, s: statistics.median(res[s][k])
print()
print(f"| | dense | MoE | MoE / dense |")
print(f"|---|---|---|---|")
print(f"| parameters on rank 0 | {res['dense']['params']:,} | {res['moe']['params']:,} | {res['moe']['params']/res['dense']['params']:.2f} |")
print(f"| tokens/s (median of rounds) | {md('tps','dense'):.0f} | {md('tps','moe'):.0f} | {md('tps','moe')/md('tps','dense'):.2f} |")
print(f"| peak RSS per rank (MiB) | {md('peak','dense'):.0f} | {md('peak','moe'):.0f} | {md('peak','moe')/md('peak','dense'):.2f} |")
print(f"| training LM loss after the last step | {md('lm','dense'):.4f} | {md('lm','moe'):.4f} | {md('lm','moe')-md('lm','dense'):+.4f} |")
print(f"| held-out loss after the last step | {md('held','dense'):.4f} | {md('held','moe'):.4f} | {md('held','moe')-md('held','dense'):+.4f} |")
print(f"| LM loss at the dense run's wall time | {md('lm','dense'):.4f} | {statistics.median(budget):.4f} | {statistics.median(budget)-md('lm','dense'):+.4f} |")
PYEOF
