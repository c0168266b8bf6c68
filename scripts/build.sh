#!/usr/bin/env bash
# Configures and builds mmfeed in Release into build/ (or $BUILD_DIR), two jobs at a time, as a
# unity build (why, and when to turn it off: CMakeLists.txt). Extra arguments go to cmake's
# configure step (e.g. -DMMFEED_SANITIZE=ON) after that default; $BUILD_TARGETS (e.g.
# "mmfeedd mmfeed-consume") builds only those targets and what they need. $CXX, where set,
# picks the compiler (scripts/demo.sh: clang++; scripts/test.sh: g++, as CI builds), else CMake
# finds one (c++); a tree configured with another compiler than $CXX is configured afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
mkdir -p "$BUILD_DIR"
# Ninja for a new build tree: it compiles a library's files while the libraries it links still
# build, where Make waits for them (the demo's targets: 100 s against 149 s on 2 cores). A tree
# configured before keeps its generator.
GENERATOR=(-G Ninja)
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  GENERATOR=()
  cached=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  if [ -n "${CXX:-}" ] && [ "$(readlink -f "$cached")" != "$(readlink -f "$(command -v "$CXX")")" ]; then
    GENERATOR=(--fresh -G Ninja)  # everything rebuilds
  fi
fi
cmake "${GENERATOR[@]}" -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON "$@" > "$BUILD_DIR/configure.log" 2>&1 || {
  cat "$BUILD_DIR/configure.log"; exit 1; }
# shellcheck disable=SC2086  # BUILD_TARGETS is a list of target names
cmake --build "$BUILD_DIR" -j2 ${BUILD_TARGETS:+--target $BUILD_TARGETS}
