#!/usr/bin/env bash
# Everything a lent GPU machine checks: such a machine has nvcc, CMake, PyTorch and pybind11 but
# none of mmfeed's Debian libraries, so what needs them is built here and carried there.
#
#   bash bench/gpu_session.sh --stage   here, after scripts/setup.sh --cuda and a build in build/:
#                                       fills build-gpu-deps/: the fmt and nlohmann-json headers,
#                                       and mmfeedd and mmfeed_tests with their shared libraries
#                                       in parts of at most 40 MB (the device tool carries 64 MiB
#                                       a call: one part a call when they do not fit together)
#   bash bench/gpu_session.sh [--steps 123] [OUTDIR]
#                                       there, carrying build-gpu-deps/include and part(s); the
#                                       parts carried are unpacked into /tmp/mmfeed-gpu, which
#                                       keeps those of earlier calls while the machine is warm.
#                                       Logs go to OUTDIR (default $OUT, else /tmp/mmfeed-gpu-out)
# The steps, each under its own time limit:
#   1. bench/gpu_check.sh: host-to-device GB/s of a registered ring vs cudaMallocHost vs
#      pageable memory, and the data stall of a mock training loop with and without the feeder;
#   2. the CUDA feeder's tests (mmfeed_tests --gtest_filter='CudaFeederTest.*') on the GPU;
#   3. the Python module, built there for its python3 (the sources client/python/setup.py
#      names), and python_client_test's CUDA tests against the real mmfeedd.
# Steps 2 and 3 are skipped, naming the libraries missing, until every part is unpacked.
set -uo pipefail
cd "$(dirname "$0")/.."
deps=build-gpu-deps

if [ "${1:-}" = "--stage" ]; then
  set -e
  bash bench/gpu_check.sh --stage-deps
  rm -f "$deps"/part-*.tar.xz
  stage=$(mktemp -d)
  cp build/bin/mmfeedd build/bin/mmfeed_tests "$stage/"
  # Their shared libraries, but not glibc's (the machine's newer one serves) nor the driver's.
  ldd build/bin/mmfeedd build/bin/mmfeed_tests | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' |
    xargs -I{} cp -L {} "$stage/"
  # Dealt largest first into parts of at most 100 MB unpacked (xz makes about a third of that).
  part=1 size=0
  mkdir -p "$stage/part-1"
  for f in $(cd "$stage" && ls -S -p | grep -v /); do
    bytes=$(stat -c %s "$stage/$f")
    if [ $size -gt 0 ] && [ $((size + bytes)) -gt 100000000 ]; then
      part=$((part + 1)) size=0
      mkdir -p "$stage/part-$part"
    fi
    mv "$stage/$f" "$stage/part-$part/"
    size=$((size + bytes))
  done
  for d in "$stage"/part-*; do tar -C "$d" -cf - . | xz -T0 -9 > "$deps/$(basename "$d").tar.xz"; done
  rm -rf "$stage"
  ls -la "$deps"
  exit 0
fi

steps=123
if [ "${1:-}" = "--steps" ]; then
  steps=$2
  shift 2
fi
out=${1:-${OUT:-/tmp/mmfeed-gpu-out}}
mkdir -p "$out"
work=/tmp/mmfeed-gpu
mkdir -p "$work/lib" "$work/wrap"
for p in "$deps"/part-*.tar.xz; do [ -f "$p" ] && tar -C "$work/lib" -xJf "$p"; done
mv -f "$work"/lib/mmfeedd "$work"/lib/mmfeed_tests "$work/" 2> /dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"

if [[ $steps == *1* ]]; then
  echo "== 1. bench/gpu_check.sh"
  timeout 300 bash bench/gpu_check.sh 2>&1 | tee "$out/gpu_check.log"
  echo "gpu_check rc ${PIPESTATUS[0]}"
fi
missing=$(LD_LIBRARY_PATH="$work/lib" ldd "$work/mmfeedd" "$work/mmfeed_tests" 2>&1 | grep -E "not found|No such" | sort -u)
if [ -n "$missing" ]; then
  echo "steps 2 and 3 skipped: the parts carried so far leave out"
  echo "$missing"
  exit 0
fi
# The daemon runs with the carried libraries (Python and PyTorch keep the machine's own), from
# where the tests look for it: build/bin of this checkout, as compiled in.
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$work/lib" "$work/mmfeedd" > "$work/wrap/mmfeedd"
chmod +x "$work/wrap/mmfeedd"
mkdir -p build/bin
[ -e build/bin/mmfeedd ] || ln -s "$work/wrap/mmfeedd" build/bin/mmfeedd
if [[ $steps == *2* ]]; then
  echo "== 2. the CUDA feeder's tests"
  timeout 120 env LD_LIBRARY_PATH="$work/lib" "$work/mmfeed_tests" --gtest_filter='CudaFeederTest.*' \
    2>&1 | tee "$out/feeder_tests.log"
  echo "feeder tests rc ${PIPESTATUS[0]}"
fi

[[ $steps == *3* ]] || exit 0
echo "== 3. the Python module and its CUDA tests"
py=python3
inc=$($py -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$($py -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
pyb=$($py -c "import pybind11; print(pybind11.get_include())" 2> /dev/null || echo /usr/include)
sources=$($py -c "import re; print(' '.join(re.findall(r'\"([a-z_/]+\.cc)\"', open('client/python/setup.py').read())))")
mkdir -p "$work/python/mmfeed"
cp client/python/mmfeed/* "$work/python/mmfeed/"
objs=()
for s in $sources; do
  o="$work/$(basename "$s" .cc).o"
  objs+=("$o")
  g++ -std=c++20 -O2 -fPIC -fvisibility=hidden -DFMT_HEADER_ONLY -I. -I"$deps/include" -I"$pyb" \
    -I"$inc" -c "$s" -o "$o" &
done
wait
if g++ -shared "${objs[@]}" -o "$work/python/mmfeed/_mmfeed$suffix" -lpthread; then
  PYTHONUNBUFFERED=1 timeout 240 $py tests/integration/python_client_test.py --bin "$work/wrap" \
    --python "$work/python" PythonClientTest.test_to_device_on_cuda_registers_the_ring_and_copies_every_byte \
    PythonClientTest.test_torch_dataset_state_dict_resumes_exactly 2>&1 | tee "$out/python_cuda_test.log"
  echo "python tests rc ${PIPESTATUS[0]}"
fi
