#!/usr/bin/env bash
# Installs what deepspeed-cpp needs on Debian bookworm (CPU machine). Idempotent: a machine that
# already has everything is not touched (no apt-get update), so repeated runs cost nothing.
#
# --cuda: also the CUDA build's LibTorch, the torch wheel pinned to the GPU machines' version
# (2.11.0, CUDA 13.0, with NCCL), into the project-local .venv-cuda. The CUDA toolkit (nvcc) is
# expected at /usr/local/cuda, as on the machines here; Debian has no CUDA 13 to install.
set -euo pipefail
want_cuda=0
for arg in "$@"; do
  case "$arg" in
    --cuda) want_cuda=1 ;;
    *) echo "install_deps: unknown argument $arg (known: --cuda)" >&2; exit 2 ;;
  esac
done

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
  libicu-dev                   # finetune_llama: the NFC normalizer of Qwen2 tokenizers
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

if ((want_cuda)); then
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv=$root/.venv-cuda
  torch_version=2.11.0
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  if [ -z "$nvcc" ]; then
    echo "install_deps --cuda: no nvcc (CUDA 13 toolkit expected at /usr/local/cuda)" >&2
    exit 1
  fi
  have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  if [[ "$have" != "$torch_version"* ]]; then
    echo "install_deps: installing torch==$torch_version (CUDA wheel) into $venv"
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version"
  fi
fi
