#!/usr/bin/env bash
# Sets everything up and runs every test: installs the Debian packages, builds in Release,
# runs ctest; then (unless MMFEED_SKIP_SANITIZERS=1) builds the tests with ASan+UBSan and runs
# them again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j2)
if [ "${MMFEED_SKIP_SANITIZERS:-0}" != 1 ]; then
  BUILD_DIR=build-asan bash scripts/build.sh -DMMFEED_SANITIZE=ON
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     ctest --output-on-failure -j2)
fi
