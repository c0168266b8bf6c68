#!/usr/bin/env bash
# The GPU check of the CUDA feeder (client/cuda_feeder.h), in one run of a few minutes:
# host-to-device GB/s from a registered ring vs cudaMallocHost vs pageable memory, and the data
# stall of a mock training loop with and without the feeder's double buffering.
#
#   bash bench/gpu_check.sh [mmfeed-gpu-check flags]   build (build-gpu/) and run
#   bash bench/gpu_check.sh --stage-deps               copy this machine's fmt and nlohmann-json
#                                                      headers to build-gpu-deps/, for a GPU
#                                                      machine without them (carry that folder)
# Builds only shm/, the client, the feeder and a synthetic ring producer: a compiler, CMake and
# CUDA are enough (no FFmpeg, OpenCV, yaml-cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
deps=build-gpu-deps
if [ "${1:-}" = "--stage-deps" ]; then
  mkdir -p "$deps/include"
  cp -r /usr/include/fmt /usr/include/nlohmann "$deps/include/"
  echo "staged fmt and nlohmann-json headers in $deps/include"
  exit 0
fi
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
extra=()
if [ -d "$deps/include" ]; then extra=(-DMMFEED_DEPS="$PWD/$deps"); fi
# MMFEED_CUDA_ARCH: the architectures to build for (default: this machine's GPU).
cmake -S bench/gpu_check -B build-gpu -DCMAKE_BUILD_TYPE=Release \
  -DMMFEED_CUDA_ARCH="${MMFEED_CUDA_ARCH:-native}" "${extra[@]}" > /dev/null
cmake --build build-gpu -j "$(nproc)"
exec build-gpu/mmfeed-gpu-check "$@"
