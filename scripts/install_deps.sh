#!/usr/bin/env bash
# Installs what deepspeed-cpp needs on Debian bookworm (CPU machine). Idempotent: a machine that
# already has everything is not touched (no apt-get update), so repeated runs cost nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev     # LibTorch 1.13 + c10d Gloo headers
  libopenblas0-pthread         # without it Debian's torch runs the reference BLAS (30-70x slower GEMM)
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox                  # train_gpt --plot (loss and lr curves as PNG)
  openssh-client openssh-server openmpi-bin iproute2  # launcher across hosts + its netns tests
  python3-torch                # checkpoint_python_test: Python's torch.load/torch.save vs our files
  python3-venv python3-pip     # scripts/setup_python_refs.sh: transformers for the Llama parity tests
  libaio-dev                   # ops/aio: Linux native async I/O for NVMe offload (docs/offload.md)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
