#!/usr/bin/env bash
# Fills .whl/ (ignored through .git/info/exclude) with what bench/gpu/run.sh needs on the lent GPU
# machine that its image lacks; that machine has no network, so this runs HERE, where pip
# reaches PyPI. The machine's python3 is CPython 3.12 with torch 2.11, numpy, ninja, psutil,
# py-cpuinfo, msgpack, einops, packaging, tqdm and nvidia-ml-py (/work/.library/device/KINDS.md);
# DeepSpeed needs, besides those:
#   deepspeed   PyPI has only an sdist: built here into a pure-Python wheel (py3-none-any) with
#               DS_BUILD_OPS=0, so no op is compiled now; DeepSpeed JIT-builds the ones it needs
#               (cpu_adam, async_io) there with the machine's nvcc and ninja.
#   hjson, pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions)
#               binary wheels for CPython 3.12 on manylinux x86-64, fetched with their
#               dependencies resolved for that target.
#   deb/libaio1, deb/libaio-dev   Debian's libaio (library + header, a few dozen KiB): DeepSpeed's
#               async_io op (NVMe offload) compiles against it; run.sh unpacks them only if the
#               machine has no libaio.h.
# Usage: bench/gpu/make_bundle.sh       env: DS_VERSION (0.19.8), PYTHON (python3: any with pip)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
DS_VERSION=${DS_VERSION:-0.19.8}
PYTHON=${PYTHON:-python3}
out=.whl

die() { echo "make_bundle: $*" >&2; exit 1; }
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"

exclude=.git/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf "$out"
mkdir -p "$out/deb"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "make_bundle: building deepspeed $DS_VERSION into a wheel (DS_BUILD_OPS=0: no ops compiled)"
# Build isolation gives setup.py a torch-less environment: it then prints "Unable to import
# torch, pre-compiling ops will be disabled" and records no installed op, which is what we want
# (ops JIT-build on the GPU machine against its own torch).
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-binary deepspeed -w "$tmp/ds" \
  "deepspeed==$DS_VERSION" >"$tmp/ds.log" 2>&1 || { tail -30 "$tmp/ds.log"; die "wheel build failed"; }
ds_wheel=$(ls "$tmp"/ds/deepspeed-*.whl)
case "$ds_wheel" in
  *-py3-none-any.whl) ;;
  *) die "expected a pure-Python wheel, got $(basename "$ds_wheel")" ;;
esac
unzip -p "$ds_wheel" 'deepspeed/git_version_info_installed.py' | grep -q "'cpu_adam': False" ||
  die "the deepspeed wheel records pre-built ops; rebuild with DS_BUILD_OPS=0"
cp "$ds_wheel" "$out/"

echo "make_bundle: fetching hjson and pydantic (with its dependencies) for CPython 3.12"
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$out" hjson 'pydantic>=2.0.0'

# DeepSpeed's own requirements must all be there or on the image.
on_image="einops msgpack ninja numpy packaging psutil py-cpuinfo tqdm torch nvidia-ml-py"
for req in $(unzip -p "$ds_wheel" '*/METADATA' | awk '/^Requires-Dist:/ && !/extra ==/ {print $2}' |
             sed 's/[<>=!;(].*//' | tr 'A-Z_' 'a-z-'); do
  case " $on_image " in *" $req "*) continue ;; esac
  ls "$out" | tr 'A-Z_' 'a-z-' | grep -q "^$req-" || die "deepspeed needs $req: neither bundled nor on the image"
done

echo "make_bundle: fetching Debian's libaio for DeepSpeed's async_io op"
(cd "$out/deb" && apt-get download -q libaio1 libaio-dev >"$tmp/apt.log" 2>&1) || {
  tail -5 "$tmp/apt.log"
  echo "make_bundle: warning: no libaio .debs (apt-get download failed); DeepSpeed's NVMe offload" \
       "will only work if the GPU machine has libaio-dev" >&2
}

# One version of each package, or pip refuses the whole install there.
dups=$(ls "$out"/*.whl | xargs -n1 basename | cut -d- -f1 | sort | uniq -d)
[ -z "$dups" ] || die "two versions of: $dups"
echo "make_bundle: contents of $out:"
ls -l "$out"/*.whl "$out"/deb/*.deb 2>/dev/null | awk '{printf "  %8.1f KiB  %s\n", $5 / 1024, $NF}'
echo "make_bundle: total $(du -sh "$out" | cut -f1) (the device tool carries at most 64 MiB in all)"
