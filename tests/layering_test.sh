#!/usr/bin/env bash
# Checks the include layering (DESIGN.md, "Layout") and what a trainer's binary links.
# usage: layering_test.sh SOURCE_DIR BIN_DIR
set -u
src=$1 bin=$2 fail=0
check() {  # folder, forbidden include prefix
  if hits=$(grep -rnE "#include \"($2)" "$src/$1"); then
    echo "$1/ must not include $2:"; echo "$hits"; fail=1
  fi
}
check base 'shm/|client/|stages/|daemon/'
check shm 'client/|stages/|daemon/'
check client 'stages/|daemon/'
check stages 'client/|daemon/'
libs=$(ldd "$bin/mmfeed-consume") || { echo "ldd failed"; exit 1; }
if echo "$libs" | grep -E 'yaml-cpp|spdlog|libnuma|libav|libsw|opencv|turbojpeg|fftw'; then
  echo "mmfeed-consume (the client library) links a daemon library"; fail=1
fi
[ $fail = 0 ] && echo "layering ok"
exit $fail
