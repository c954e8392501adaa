#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest). Extra arguments go to
# ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "${DS_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 "$@"
