#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest). Extra arguments go to
# ctest, e.g. `scripts/test.sh -L unit`.
#
# Tests run two at a time by default (DS_TEST_JOBS sets it): most spend much of their time in
# process start-up, Python imports, file I/O and waits between ranks, so on the 2-core machine
# the suite took 19-24 min where one at a time took 47. Multi-rank tests reserve their ports and directories
# per process, so they may run beside each other.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "${DS_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 -j "${DS_TEST_JOBS:-2}" "$@"
