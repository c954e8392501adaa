#!/usr/bin/env bash
# The C++ compiler launcher (CMakeLists.txt): ccache, set up so that a second checkout of the
# project (CI's fresh clone, a helper's worktree) hits the cache the first one filled.
#   ccache_launcher.sh <ccache> <source root> <compiler> <args...>
#
# Why more than plain ccache:
# - ccache caches nothing that uses a precompiled header unless sloppiness allows it, and reuses
#   nothing across checkouts unless paths are relative to base_dir. build.sh set both, but only
#   for builds it ran: a plain `ninja` in build/ filled the cache with entries no clone could use.
#   They are set here, for every compile, unless the caller set them.
# - A TU that uses the precompiled header is hashed with the .gch, and GCC's .gch differs from
#   build to build (632 MB, addresses and paths inside): a clone compiles its own, so every TU
#   missed. ccache hashes "<gch>.sum" instead when it exists (pch_external_checksum). After
#   compiling a .gch we write that file: a hash of what the .gch is made of, the header's
#   preprocessed text without line markers, the flags with the root cut off, and the compiler's
#   version. Two checkouts then agree, and a changed LibTorch header or flag still changes it.
#   The root is cut from the text too: with the CUDA build's LibTorch in the checkout's
#   .venv-cuda, __FILE__ in its inline functions expands to paths under the root.
set -euo pipefail
ccache=$1 root=$2
shift 2
sloppiness=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-$sloppiness}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_PCH_EXTSUM=${CCACHE_PCH_EXTSUM:-true}

gch=
prev=
for arg in "$@"; do
  [[ $prev == -o && $arg == *.gch ]] && gch=$arg
  prev=$arg
done
if [ -z "$gch" ]; then
  exec "$ccache" "$@"
fi

# A .sum left from an older .gch must not outlive a failed compile of the new one.
rm -f "$gch.sum"
"$ccache" "$@"

# The same command, preprocessing only: drop the output and dependency-file options.
pre=()
skip=0
for arg in "$@"; do
  if ((skip)); then skip=0; continue; fi
  case $arg in
    -o | -MT | -MF | -MQ) skip=1 ;;
    -c | -MD | -MMD) ;;
    *) pre+=("$arg") ;;
  esac
done
{
  "$1" --version | sed -n 1p
  printf '%s\n' "${pre[@]:1}" | sed "s#$CCACHE_BASEDIR#<root>#g"
  "${pre[@]}" -E -P -o - | sed "s#$CCACHE_BASEDIR#<root>#g" | sha256sum
} | sha256sum | cut -d' ' -f1 > "$gch.sum.tmp"
mv "$gch.sum.tmp" "$gch.sum"
