#!/usr/bin/env bash
# Makes the project-local Python environment .venv that the reference tests run transformers in
# (finetune_llama parity with transformers' GGUF loader and LlamaForCausalLM). It is created with
# --system-site-packages over Debian's python3 so that it uses Debian's python3-torch 1.13; the
# pins below are the newest releases that still work with torch 1.13 and load GGUF tied
# embeddings correctly (transformers 4.47 is the first to tie a GGUF's missing output.weight).
# Idempotent and CI-safe: a .venv whose stamp matches the pins is kept. Usage: [VENV_DIR]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
readonly PINS="transformers==4.47.1 tokenizers==0.21.4 gguf==0.10.0 sentencepiece==0.2.0 \
accelerate==0.34.2 safetensors==0.8.0 huggingface_hub==0.36.2"
python=/usr/bin/python3

die() { echo "setup_python_refs: $*" >&2; exit 1; }
[ -x "$python" ] || die "$python is missing (scripts/install_deps.sh installs python3-torch)"
"$python" -c 'import torch' 2>/dev/null || die "Debian's python3-torch is missing; run scripts/install_deps.sh"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # concurrent tests share one setup
if [ -f "$venv/.pins" ] && [ "$(cat "$venv/.pins")" = "$PINS" ]; then
  echo "setup_python_refs: $venv is up to date"
  exit 0
fi
rm -rf "$venv"
"$python" -m venv --system-site-packages "$venv" || die "python3 -m venv failed (install python3-venv)"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $PINS ||
  die "pip install of $PINS failed"
"$venv/bin/python" -c 'import torch, transformers, gguf, tokenizers' ||
  die "the new environment cannot import torch/transformers/gguf"
echo "$PINS" > "$venv/.pins"
echo "setup_python_refs: made $venv ($PINS)"
