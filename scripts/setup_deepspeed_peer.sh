#!/usr/bin/env bash
# Makes the project-local .venv-deepspeed: PyPI's DeepSpeed over Debian's python3-torch 1.13 (the
# LibTorch build train_gpt links), the peer of the CPU benchmarks that run DeepSpeed itself
# (bench/pipeline). 0.15.4 is the newest DeepSpeed that runs on torch 1.13: 0.16 registers module
# hooks with torch 2's `prepend` argument. On CPU its communication backend JIT-compiles a
# shared-memory op when the first process group is made (it needs pybind11-dev); that op is
# compiled here, once, so that no timed run pays for it.
#
# --torch2 makes .venv-deepspeed-torch2 instead: DeepSpeed 0.19.8 over torch 2.11, for what
# torch 1.13 cannot run (its Gloo has no bf16 collectives, so DeepSpeed cannot train bf16 there).
# The torch is the CUDA build's wheel in .venv-cuda (scripts/install_deps.sh --cuda), reached
# through a .pth file rather than installed twice; without .venv-cuda the wheel is installed into
# this venv. DeepSpeed runs on the CPU there all the same (DS_ACCELERATOR=cpu). It also gets
# transformers 5 (DeepSpeed's AutoEP replaces its Mixtral blocks; the reference for the models
# transformers 4.47 lacks) and gguf.
# Idempotent: a venv whose stamp matches the pins, and whose torch imports, is kept.
# Usage: [--torch2] [VENV_DIR]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
torch2=0
if [ "${1:-}" = "--torch2" ]; then
  torch2=1
  shift
fi
if ((torch2)); then
  venv=${1:-$root/.venv-deepspeed-torch2}
  readonly TORCH_PIN="torch==2.11.0"
  # AutoEP's Mixtral preset needs transformers 5 (bench/token_choice_moe); 5.15.1 is the one
  # its layer replacement runs with (5.25's output-recorder registry changed its signature).
  readonly TRANSFORMERS_PIN="transformers==5.15.1"
  # transformers' GGUF loader (llama_parity_test's Qwen3 GGUFs) needs accelerate, and reads a
  # Qwen3/Qwen3-MoE file through gguf's architecture tables, which know them from 0.17 on.
  readonly GGUF_PINS="gguf==0.19.0 accelerate==1.16.0"
  readonly PINS="deepspeed==0.19.8 $TORCH_PIN $TRANSFORMERS_PIN $GGUF_PINS"
else
  venv=${1:-$root/.venv-deepspeed}
  readonly PINS="deepspeed==0.15.4"
fi
python=/usr/bin/python3

die() { echo "setup_deepspeed_peer: $*" >&2; exit 1; }
[ -x "$python" ] || die "$python is missing (scripts/install_deps.sh installs python3-torch)"
if ((!torch2)); then
  "$python" -c 'import torch' 2>/dev/null ||
    die "Debian's python3-torch is missing; run scripts/install_deps.sh"
fi
if [ ! -f /usr/include/pybind11/pybind11.h ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q >/dev/null
  $sudo apt-get install -y -q pybind11-dev >/dev/null || die "apt-get install pybind11-dev failed"
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -f "$venv/.pins" ] && [ "$(cat "$venv/.pins")" = "$PINS" ] &&
    "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "setup_deepspeed_peer: $venv is up to date"
  exit 0
fi
rm -rf "$venv"
if ((torch2)); then
  "$python" -m venv "$venv" || die "python3 -m venv failed (install python3-venv)"
  wheel_site=$(echo "$root"/.venv-cuda/lib/python3*/site-packages)
  wheel_torch=$("$root/.venv-cuda/bin/python" -c 'import torch; print(torch.__version__)' \
                  2>/dev/null || true)
  if [ -d "$wheel_site/torch" ] && [[ "$wheel_torch" == "${TORCH_PIN#torch==}"* ]]; then
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$wheel_site" > "$site/torch_wheel.pth"
  else
    echo "setup_deepspeed_peer: no torch 2.11 in .venv-cuda; installing $TORCH_PIN into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$TORCH_PIN" ||
      die "pip install $TORCH_PIN failed"
  fi
else
  "$python" -m venv --system-site-packages "$venv" ||
    die "python3 -m venv failed (install python3-venv)"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${PINS%% *}" ||
  die "pip install ${PINS%% *} failed"
if ((torch2)); then
  # shellcheck disable=SC2086  # GGUF_PINS is a list
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$TRANSFORMERS_PIN" \
      $GGUF_PINS || die "pip install $TRANSFORMERS_PIN $GGUF_PINS failed"
fi
readonly CHECK='
import os, torch, deepspeed
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load()
if os.environ.get("DS_PEER_CPU_ADAM") == "1":  # DeepSpeedCPUAdam for bf16 master weights
    get_accelerator().create_op_builder("CPUAdamBuilder").load()
print(f"setup_deepspeed_peer: deepspeed {deepspeed.__version__} on torch {torch.__version__}")'
DS_ACCELERATOR=cpu DS_PEER_CPU_ADAM=$torch2 "$venv/bin/python" -c "$CHECK" ||
  die "DeepSpeed does not import, or cannot build its CPU shared-memory op"
echo "$PINS" > "$venv/.pins"
echo "setup_deepspeed_peer: made $venv ($PINS)"
