#!/usr/bin/env bash
# Installs every Debian package mmfeed needs to build, test and run its demo.
# Usage: scripts/setup.sh [--demo | --build-only] [--bench] [--cuda]
#   --demo installs only what the demo builds and runs (scripts/demo.sh): no test tools, no
#          servers the tests start, no s3rver
#   --build-only installs only what the daemon, the client and the Python module build from
#          (the demo runs `--demo` meanwhile, in the background, for the rest)
#   --bench adds the other baselines: torchaudio, OpenCV, ...
#   --cuda enables Debian's contrib and non-free components and installs the CUDA toolkit
#          (nvidia-cuda-dev: the runtime and headers, CUDA 11.8; nvidia-cuda-toolkit: nvcc), so
#          the CUDA feeder builds and its no-GPU tests run; a GPU is not needed
# Started with sh (dash)? bash runs it: the script needs bash's arrays and pipefail.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -euo pipefail
# What to run as root if sudo is missing: --build-only is the demo's first step, --demo has it all.
ARGS="$*"
ARGS=${ARGS/--build-only/--demo}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
# Called before the first change to the system: a user who is not root needs sudo for it.
need_root() {  # $1: what is about to be done
  if [ -n "$SUDO" ] && ! command -v sudo > /dev/null; then
    echo "scripts/setup.sh: $1 needs root, and sudo is not installed: run it as root" \
      "(su -c 'bash scripts/setup.sh $ARGS'), or install sudo and add yourself to its group" \
      "(as root: apt-get install sudo && adduser $(id -un) sudo, then log in again)" >&2
    exit 1
  fi
}
# The build tools, installed first (below). clang (the demo's compiler: scripts/demo.sh) and make,
# not build-essential: its dpkg-dev brings Perl, which only the Debian package needs; TEST_PKGS
# has it, and g++, the tests' compiler.
TOOLS=(clang make cmake ninja-build pkg-config python3)
# What the daemon, the client and the Python module build from.
PKGS=(
  "${TOOLS[@]}"
  libasio-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libconcurrentqueue-dev
  nlohmann-json3-dev libssl-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libturbojpeg0-dev
  libjpeg62-turbo-dev libnuma-dev libsystemd-dev
  libicu-dev zlib1g-dev libcurl4-openssl-dev libxxhash-dev
  libsnappy-dev libzstd-dev liblz4-dev libbrotli-dev
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev
  python3-dev pybind11-dev
)
# What the demo runs besides: the trainer's side (PyTorch; Pillow also makes the dataset), the
# service.
RUN_PKGS=(python3-numpy python3-torch python3-torchvision python3-pil systemd)
# What the tests, the fuzzers and the package need besides (ffmpeg makes the tests' media).
TEST_PKGS=(
  g++ ffmpeg
  libgtest-dev libgmock-dev libbenchmark-dev clang-format libclang-rt-14-dev
  python3-av python3-yaml python3-jsonschema
  python3-venv python3-pip python3-setuptools python3-wheel lintian dpkg-dev
  mkdocs mkdocs-material chromium python3-websocket  # the docs site: built --strict, opened in Chromium
)
demo=0
build_only=0
bench=0
cuda=0
for arg in "$@"; do
  case "$arg" in
    --demo) demo=1 ;;
    --build-only) demo=1 build_only=1 ;;
    --bench) bench=1 ;;
    --cuda) cuda=1 ;;
    *) echo "usage: scripts/setup.sh [--demo | --build-only] [--bench] [--cuda]" >&2; exit 2 ;;
  esac
done
if [ $build_only = 0 ]; then PKGS+=("${RUN_PKGS[@]}"); fi
if [ $demo = 0 ]; then PKGS+=("${TEST_PKGS[@]}"); fi
if [ $cuda = 1 ]; then
  # CUDA comes from non-free (its installer from contrib). Debian 12 lists components in
  # /etc/apt/sources.list.d/debian.sources (deb822) or /etc/apt/sources.list.
  if [ -f /etc/apt/sources.list.d/debian.sources ] &&
    ! grep -q "^Components:.*non-free\b" /etc/apt/sources.list.d/debian.sources; then
    need_root "enabling Debian's contrib and non-free components"
    $SUDO sed -i -E 's/^(Components:.*\bmain\b)(.*)$/\1\2 contrib non-free/' \
      /etc/apt/sources.list.d/debian.sources
  fi
  if [ -f /etc/apt/sources.list ] && grep -qE "^deb .* main" /etc/apt/sources.list &&
    ! grep -qE "^deb .* main.*non-free( |$)" /etc/apt/sources.list; then
    need_root "enabling Debian's contrib and non-free components"
    $SUDO sed -i -E '/^deb /s/ main( |$)/ main contrib non-free\1/' /etc/apt/sources.list
  fi
  PKGS+=(nvidia-cuda-dev nvidia-cuda-toolkit)
fi
if [ $bench = 1 ]; then
  PKGS+=(python3-torchaudio python3-opencv espeak-ng)
fi
# Debian's nodejs and npm (the remote-storage tests run s3rver), unless a Node.js with npm is
# there already (nodesource's nodejs bundles npm and conflicts with Debian's npm package).
if [ $demo = 0 ] && ! command -v npm > /dev/null; then PKGS+=(nodejs npm); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The build tools download alone, then install while every other missing package downloads in
# the background; then the rest installs from apt's cache: apt alone downloads everything before
# it unpacks anything. `apt-get download` takes no lock; a failed download leaves the packages to
# apt.
plan() {  # the packages (name=version) apt would install for "$@"
  apt-get install -s --no-install-recommends "$@" | awk '/^Inst /{print $2 "=" substr($3, 2)}' | sort
}
if [ ${#missing[@]} -gt 0 ]; then
  need_root "installing ${#missing[@]} Debian package(s)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  tools=()
  for p in "${TOOLS[@]}"; do
    if [[ " ${missing[*]} " == *" $p "* ]]; then tools+=("$p"); fi
  done
  if [ ${#tools[@]} -gt 0 ] && [ ${#tools[@]} -lt ${#missing[@]} ]; then
    fetch_dir=$(mktemp -d -p /var/tmp)  # on disk, where /tmp may be a small tmpfs
    fetch=""
    end_fetch() {  # stops the download if it still runs, removes its folder
      [ -z "$fetch" ] || kill -- -"$fetch" 2> /dev/null || true
      $SUDO rm -rf "$fetch_dir" "$fetch_dir.list" "$fetch_dir.log"
    }
    # An interrupted setup (Ctrl-C, a failed install) leaves no download running and no folder.
    trap end_fetch EXIT
    chown _apt "$fetch_dir" 2> /dev/null || true  # root's apt downloads as _apt
    comm -23 <(plan "${missing[@]}") <(plan "${tools[@]}") > "$fetch_dir.list"
    $SUDO apt-get install -y -d --no-install-recommends "${tools[@]}"
    # In its own process group (setsid), so that the trap stops apt-get's children too.
    # shellcheck disable=SC2016  # $1 is the inner shell's argument
    setsid sh -c 'cd "$1" && exec xargs -r -a "$1.list" apt-get download -q' sh "$fetch_dir" \
      > "$fetch_dir.log" 2>&1 &
    fetch=$!
    $SUDO apt-get install -y --no-install-recommends "${tools[@]}"
    if wait $fetch; then
      find "$fetch_dir" -name '*.deb' -exec $SUDO mv -t /var/cache/apt/archives/ {} +
    else
      echo "scripts/setup.sh: downloading ahead failed; apt downloads the rest:" >&2
      tail -3 "$fetch_dir.log" >&2
    fi
    fetch=""
    end_fetch
    trap - EXIT
  fi
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
if [ $demo = 1 ]; then exit 0; fi
# Servers the tests start themselves: promtool (tests check the /metrics page with it) comes
# only with the Prometheus server, nginx-light serves shards to the remote-storage tests, and
# Slurm (slurmctld, slurmd, munge) runs the simulated two-node cluster of the Slurm test. They
# are installed with their services kept from starting (policy-rc.d) and left disabled.
services=()
command -v promtool > /dev/null || services+=(prometheus)
command -v nginx > /dev/null || services+=(nginx-light)
command -v slurmctld > /dev/null || services+=(slurmctld slurmd slurm-client munge)
if [ ${#services[@]} -gt 0 ]; then
  need_root "installing the servers the tests start (${services[*]})"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" > /dev/null
    $SUDO chmod +x "$policy"
    trap '$SUDO rm -f '"$policy" EXIT
  fi
  if [ ${#missing[@]} -eq 0 ]; then $SUDO apt-get update; fi
  $SUDO apt-get install -y --no-install-recommends "${services[@]}"
  if [ -d /run/systemd/system ]; then
    for unit in prometheus nginx slurmctld slurmd munge; do
      $SUDO systemctl disable --now "$unit" 2> /dev/null || true
    done
  fi
fi
# s3rver (npm): the S3-compatible server the remote-storage tests start on loopback.
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$root/build-tools/node_modules/.bin/s3rver" ]; then
  npm install --prefix "$root/build-tools" --no-audit --no-fund --loglevel=error s3rver@3.7.1
fi
# DuckDB (npm): the independent writer and reader of the Parquet tests' files.
if [ ! -f "$root/build-tools/node_modules/@duckdb/node-api/package.json" ]; then
  npm install --prefix "$root/build-tools" --no-audit --no-fund --loglevel=error @duckdb/node-api@1.5.6-r.1
fi
