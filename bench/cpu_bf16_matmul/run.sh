#!/usr/bin/env bash
# bf16 training on the CPU path of AVX2-only machines, where LibTorch 1.13's bf16 GEMM accumulates
# in bf16 (no oneDNN path) and the engine computes bf16 matmuls as fp32 products instead
# (docs/precision.md). Any CPU takes that path here: DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN=1
# disables oneDNN in the engine's process, as an AVX2-only CPU lacks it.
# Side by side, in each round: train_gpt (2 ranks, ZeRO-0, the example config with bf16 on)
#   ours_fp32mm   the fallback path with the engine's fp32-product kernels (what such a CPU runs)
#   aten_bf16mm   the fallback path with LibTorch's own bf16-accumulating GEMM
#                 (DS_CPU_BF16_MATMUL=native)
#   onednn        this CPU's own bf16 path (oneDNN where it has AVX-512: the fast reference)
#   fp32          the same model trained in fp32 (what such a CPU would run without bf16)
# and the product itself in PyTorch (Debian's python3-torch, the same LibTorch): a bf16 mm with
# oneDNN off against the upcast fp32 mm, time and error against the fp64 product.
# Usage: bench/cpu_bf16_matmul/run.sh [MODEL FLAGS...]
# Env: ROUNDS (3), STEPS (6), SKIP (2 warm-up steps not timed), OUT_DIR (default a new
#      /tmp/cpu_bf16_matmul.* directory), RUN_TIMEOUT_S (900).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
SKIP=${SKIP:-2}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-900}
PY=/usr/bin/python3  # Debian's python3-torch (same LibTorch build); not the pyenv python3 on PATH
launcher=build/bin/deepspeed
ours=build/bin/train_gpt
corpus=data/austen.txt
model_flags=("$@")
variants=(ours_fp32mm aten_bf16mm onednn fp32)

die() { echo "cpu_bf16_matmul: $*" >&2; exit 1; }
for bin in "$launcher" "$ours"; do
  [ -x "$bin" ] || die "$bin not found; build it first with scripts/build.sh"
done
[ -f "$corpus" ] || die "$corpus not found; fetch it with scripts/fetch_corpus.sh"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch; install python3-torch"
((STEPS > SKIP)) || die "STEPS ($STEPS) must exceed SKIP ($SKIP)"

# Pinned environment (bench/README.md): one thread per rank, Gloo on loopback.
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
unset DS_CPU_BF16_MATMUL DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
out=${OUT_DIR:-$(mktemp -d /tmp/cpu_bf16_matmul.XXXXXX)}
mkdir -p "$out/bin"
cp "$launcher" "$ours" "$out/bin/"  # others may rebuild build/ while this runs
launcher=$out/bin/deepspeed
ours=$out/bin/train_gpt
echo "INFO cpu_bf16_matmul: rounds=$ROUNDS steps=$STEPS skip=$SKIP model_flags='${model_flags[*]}' out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo);" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$out" <<'PYEOF'
import json, sys
with open("examples/train_gpt/ds_config.json") as f:
    base = json.load(f)
base.pop("fp16", None)
for name, bf16 in (("bf16", True), ("fp32", False)):
    cfg = json.loads(json.dumps(base))
    cfg["bf16"] = {"enabled": bf16}
    cfg.setdefault("zero_optimization", {})["stage"] = 0
    with open(f"{sys.argv[1]}/ds_config_{name}.json", "w") as f:
        json.dump(cfg, f, indent=2)
PYEOF

echo "PEER PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), one thread, 512x1024 @ 1024x768:"
"$PY" - <<'PYEOF'
import statistics, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
a, b = torch.randn(512, 1024), torch.randn(1024, 768)
exact = a.double() @ b.double()
a16, b16 = a.bfloat16(), b.bfloat16()

def timed(fn):
    fn()
    times = []
    for _ in range(5):
        t = time.perf_counter(); r = fn(); times.append(time.perf_counter() - t)
    err = ((r.double() - exact).norm() / exact.norm()).item()
    return statistics.median(times) * 1e3, err

torch.backends.mkldnn.enabled = False
for name, fn in (("bf16 mm, oneDNN off (LibTorch's GEMM)", lambda: a16 @ b16),
                 ("fp32 mm of the upcast operands, rounded", lambda: (a16.float() @ b16.float()).bfloat16())):
    ms, err = timed(fn)
    print(f"RESULT peer {name}: {ms:.1f} ms, relative error {err:.4f}")
torch.backends.mkldnn.enabled = True
ms, err = timed(lambda: a16 @ b16)
print(f"RESULT peer bf16 mm, this CPU's own path: {ms:.1f} ms, relative error {err:.4f}")
PYEOF

run() {  # run VARIANT ROUND
  local v=$1 r=$2 cfg=$out/ds_config_bf16.json env=()
  case $v in
    ours_fp32mm) env=(DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN=1) ;;
    aten_bf16mm) env=(DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN=1 DS_CPU_BF16_MATMUL=native) ;;
    onednn) ;;
    fp32) cfg=$out/ds_config_fp32.json ;;
  esac
  local metrics=$out/round${r}_$v.jsonl log=$out/round${r}_$v.log
  rm -f "$metrics"
  env "${env[@]}" timeout "$RUN_TIMEOUT_S" "$launcher" --num_gpus 2 \
    --master_port $((29600 + RANDOM % 2000)) "$ours" --deepspeed_config "$cfg" --data "$corpus" \
    --steps "$STEPS" --eval_batches 2 --metrics_file "$metrics" "${model_flags[@]}" >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "$v round $r failed (log: $log)"; }
}

for ((r = 1; r <= ROUNDS; r++)); do
  order=("${variants[@]}")
  ((r % 2 == 0)) && order=(fp32 onednn aten_bf16mm ours_fp32mm)
  echo "ROUND $r/$ROUNDS order=$(IFS=,; echo "${order[*]}")"
  for v in "${order[@]}"; do run "$v" "$r"; done
done
"$PY" bench/cpu_bf16_matmul/report.py "$out" --skip "$SKIP" --rounds "$ROUNDS"
