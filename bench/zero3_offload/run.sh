#!/usr/bin/env bash
# The largest GPT this machine trains, two ways (docs/offload.md, "Benchmark"):
#   nvme: ZeRO-3, offload_param + offload_optimizer "nvme" (ZeRO-Infinity), model built in zero::Init
#   cpu:  ZeRO-2, offload_optimizer "cpu" (ZeRO-Offload)
# train_gpt on 2 ranks, fp32, for each model size in SIZES (ascending) until one fails. Each rank
# runs under a hard memory cap (RLIMIT_DATA via prlimit, RANK_MEM_GB each: the machine's RAM
# split between the ranks, with room for the system), so "does not fit" is an allocation failure
# with the engine's memory report, never the OOM killer. Prints per size: parameters, tokens/s
# (median step time after the first step), peak RSS per rank, bytes swapped to NVMe; then the
# largest size each way and their ratio.
# Usage: bench/zero3_offload/run.sh
# Env: BUILD_DIR (build), NVME_DIR (/tmp: where swap files go; point it at the NVMe),
#      RANK_MEM_GB (11), STEPS (3), SEQ (64), SIZES_CPU / SIZES_NVME ("L:E ..." n_layer:n_embd,
#      heads = E/64, ascending), VARIANTS ("cpu nvme"), TIMEOUT_S (1500 per run).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

BUILD_DIR=${BUILD_DIR:-build}
NVME_DIR=${NVME_DIR:-/tmp}
RANK_MEM_GB=${RANK_MEM_GB:-11}
STEPS=${STEPS:-3}
SEQ=${SEQ:-64}
SIZES_CPU=${SIZES_CPU:-"24:1024 24:1536 32:1792"}
SIZES_NVME=${SIZES_NVME:-"24:1536 32:1792 40:2048"}
VARIANTS=${VARIANTS:-"cpu nvme"}
TIMEOUT_S=${TIMEOUT_S:-1500}
PY=/usr/bin/python3
launcher=$BUILD_DIR/bin/deepspeed
ours=$BUILD_DIR/bin/train_gpt
corpus=data/austen.txt

die() { echo "zero3_offload bench: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do
  [ -x "$bin" ] || die "$bin not found; build it first (cmake --build $BUILD_DIR --target $(basename "$bin"))"
done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
command -v prlimit >/dev/null || die "prlimit (util-linux) not found"

# Pinned environment (bench/README.md): one thread per rank, Gloo on loopback.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=$(mktemp -d /tmp/zero3_offload_bench.XXXXXX)
swap="$NVME_DIR/ds_bench_swap.$$"
trap 'rm -rf "$swap"' EXIT
echo "INFO zero3_offload bench: cpu sizes=[$SIZES_CPU] nvme sizes=[$SIZES_NVME] steps=$STEPS seq=$SEQ rank cap=${RANK_MEM_GB} GiB nvme=$NVME_DIR out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo); $(nproc --all) cores;" \
     "RAM $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo);" \
     "free disk at $NVME_DIR $(df -h --output=avail "$NVME_DIR" | tail -1 | tr -d ' ')"

"$PY" - "$out" "$swap" <<'PYEOF'
import json, os, sys
out, swap = sys.argv[1], sys.argv[2]
base = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "steps_per_print": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
nvme = dict(base, zero_optimization={
    "stage": 3, "sub_group_size": 50000000, "reduce_bucket_size": 50000000,
    "stage3_prefetch_bucket_size": 50000000, "stage3_max_live_parameters": 100000000,
    "stage3_max_reuse_distance": 50000000,
    "offload_optimizer": {"device": "nvme", "nvme_path": swap, "buffer_count": 2,
                          "pipeline_read": True, "pipeline_write": True},
    "offload_param": {"device": "nvme", "nvme_path": swap, "buffer_count": 4,
                      "buffer_size": 50000000, "max_in_cpu": 0}},
    aio={"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 2})
cpu = dict(base, zero_optimization={"stage": 2, "reduce_bucket_size": 50000000,
                                    "offload_optimizer": {"device": "cpu"}})
for name, cfg in (("nvme", nvme), ("cpu", cpu)):
    json.dump(cfg, open(os.path.join(out, f"ds_config_{name}.json"), "w"), indent=2)
PYEOF

cap=$((RANK_MEM_GB * 1024 * 1024 * 1024))
port=$((29800 + RANDOM % 1000))
for v in $VARIANTS; do
  sizes=$SIZES_CPU
  [ "$v" = nvme ] && sizes=$SIZES_NVME
  for size in $sizes; do
    L=${size%%:*}; E=${size##*:}; H=$((E / 64))
    run="$v.L${L}_E${E}"
    rm -rf "$swap"
    echo "INFO $run: starting $(date +%T)"
    set +e
    timeout "$TIMEOUT_S" prlimit --data="$cap" "$launcher" --num_gpus 2 --master_port "$port" \
      "$ours" --deepspeed_config "$out/ds_config_$v.json" --steps "$STEPS" --data "$corpus" \
      --compact_vocab --n_layer "$L" --n_head "$H" --n_embd "$E" --seq_len "$SEQ" \
      --eval_batches 1 --metrics_file "$out/$run.jsonl" >"$out/$run.log" 2>&1
    rc=$?
    set -e
    port=$((port + 1))
    echo "$rc" >"$out/$run.rc"
    if [ "$rc" -ne 0 ]; then
      echo "INFO $run: failed (exit $rc); $(grep -m1 -E 'out of memory|error' "$out/$run.log" | cut -c1-200)"
      break  # larger sizes need more
    fi
  done
done

"$PY" - "$out" "$VARIANTS" "$SIZES_CPU" "$SIZES_NVME" <<'PYEOF'
import json, os, re, statistics, sys
out, variants = sys.argv[1], sys.argv[2].split()
sizes = {"cpu": sys.argv[3].split(), "nvme": sys.argv[4].split()}
largest = {}
for v in variants:
    for size in sizes[v]:
        L, E = size.split(":")
        run = f"{v}.L{L}_E{E}"
        if not os.path.exists(f"{out}/{run}.rc"):
            continue
        rc = int(open(f"{out}/{run}.rc").read())
        # Rank 0's memory report after initialization: "nvme <MB> MB" in swap files.
        nv = re.findall(r"\| nvme ([\d.]+) MB", log := open(f"{out}/{run}.log", errors="replace").read())
        swapped = max((float(x) for x in nv), default=0.0) * 1e6
        m = re.search(r"(\d+) params,", log)
        params = int(m.group(1)) / 1e6 if m else float("nan")
        if rc != 0:
            print(f"RESULT {v:4s} n_layer={L} n_embd={E} params={params:.0f}M  does not train (exit {rc})")
            continue
        rows = [json.loads(l) for l in open(f"{out}/{run}.jsonl")]
        tokens_per_step = rows[-1]["tokens"] / rows[-1]["step"]
        times = [r["step_time_s"] for r in rows[1:]] or [rows[0]["step_time_s"]]
        tps = tokens_per_step / statistics.median(times)
        peak = max(max(r["peak_rss_bytes"]) for r in rows) / 2**30
        print(f"RESULT {v:4s} n_layer={L} n_embd={E} params={params:.0f}M tokens/s={tps:.2f} "
              f"step_s={statistics.median(times):.1f} peak_rss_per_rank={peak:.2f}GiB "
              f"nvme_files_per_rank={swapped / 2**30:.1f}GiB")
        largest[v] = (params, tps)
for v, (params, tps) in largest.items():
    print(f"LARGEST {v}: {params:.0f}M parameters at {tps:.2f} tokens/s")
if "nvme" in largest and "cpu" in largest:
    print(f"RATIO largest params nvme/cpu {largest['nvme'][0] / largest['cpu'][0]:.2f}")
PYEOF
