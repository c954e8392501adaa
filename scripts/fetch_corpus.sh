#!/usr/bin/env bash
# Puts the Jane Austen corpus (train_gpt's default text) at DEST, default data/austen.txt:
# downloads Debian's r-cran-janeaustenr .deb (never installs it: that would pull in R), unpacks
# it in a temp dir, extracts the six novels with austen_extract and checks the SHA-256.
# Usage: scripts/fetch_corpus.sh [DEST]   env: AUSTEN_EXTRACT (default build/bin/austen_extract)
# Non-interactive (CI-safe): never prompts; sudo is used only if not root, and only with -n.
set -euo pipefail

readonly EXPECTED_SHA256=ae4140c6e5ab543cc81f68358120258f0935ac9e27a30f44a7a564b349307867
readonly PACKAGE=r-cran-janeaustenr
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/data/austen.txt}
extract=${AUSTEN_EXTRACT:-$root/build/bin/austen_extract}

die() { echo "fetch_corpus: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$EXPECTED_SHA256" ]; then
  echo "fetch_corpus: $dest is up to date"
  exit 0
fi
[ -x "$extract" ] || die "$extract not found; build it first (cmake --build build --target \
austen_extract) or point AUSTEN_EXTRACT at it"
for tool in apt-get dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing; this script needs a Debian-based system"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo -n)

# apt-get download needs the package lists; a fresh container has none, so update only when
# the package is unknown (an update costs time and needs root).
download() { (cd "$tmp" && apt-get download -q "$PACKAGE") >"$tmp/apt.log" 2>&1; }
if ! download; then
  unknown="unable to locate|no packages found|has no installation candidate"
  if grep -qiE "$unknown" "$tmp/apt.log"; then
    echo "fetch_corpus: $PACKAGE unknown to apt; running apt-get update"
    "${sudo_cmd[@]}" apt-get update -qq </dev/null ||
      die "apt-get update failed (as non-root this needs passwordless sudo)"
    download || { cat "$tmp/apt.log" >&2; die "apt-get download $PACKAGE failed"; }
  else
    cat "$tmp/apt.log" >&2
    die "apt-get download $PACKAGE failed"
  fi
fi

deb=$(find "$tmp" -maxdepth 1 -name "${PACKAGE}_*.deb" | head -n 1)
[ -n "$deb" ] || die "apt-get download left no ${PACKAGE}_*.deb in $tmp"
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" "$tmp/root"
rdb=$(find "$tmp/root" -path '*/janeaustenr/data/Rdata.rdb' | head -n 1)
[ -n "$rdb" ] || die "$PACKAGE $version has no janeaustenr/data/Rdata.rdb; its layout changed"

# austen_extract checks the hash too; --no-verify so that this script reports a mismatch with
# the package version in the message.
"$extract" --no-verify "$rdb" "$tmp/austen.txt" >/dev/null
got=$(sha_of "$tmp/austen.txt")
if [ "$got" != "$EXPECTED_SHA256" ]; then
  die "corpus from $PACKAGE $version has sha256 $got ($(stat -c %s "$tmp/austen.txt") bytes), \
expected $EXPECTED_SHA256 (4025033 bytes, from $PACKAGE 1.0.0-1 on Debian bookworm); not installed"
fi

# Copy next to DEST first, then rename: DEST is never seen half-written.
mkdir -p "$(dirname "$dest")"
cp "$tmp/austen.txt" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "fetch_corpus: wrote $dest ($PACKAGE $version, sha256 $got)"
