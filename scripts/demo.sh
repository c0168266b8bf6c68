#!/usr/bin/env bash
# Sets everything up and runs the demo: builds mmfeed, makes a small image-text dataset from
# the photos in tests/data/photos, starts mmfeedd on configs/demo.yaml, feeds two consumer
# ranks, and prints their throughput and the daemon's profile; then the trainer's side: the
# training step of examples/train_image_text.py fed by mmfeed and by a DataLoader(num_workers=2)
# on the same files (bench/train_loop_bench.py), with each one's data stall share.
# It builds into build/ (or $BUILD_DIR); MMFEED_DEMO_SETUP=0 skips the apt step (scripts/test.sh
# runs the demo so, after its own).
# Started with sh (dash)? bash runs it: the script needs bash's arrays and pipefail.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=demo-data
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR
mkdir -p "$DATA"
SETUP=""
if [ "${MMFEED_DEMO_SETUP:-1}" != 0 ]; then
  # What the build needs first; the rest (PyTorch, ...) installs while it compiles.
  bash scripts/setup.sh --build-only
  bash scripts/setup.sh --demo > "$DATA/setup.log" 2>&1 &
  SETUP=$!
fi
# A new tree builds with clang++: the demo's targets take a quarter less CPU time than with g++
# (docs/benchmarks/demo.md). The tests build with g++; CI runs this demo too, built with
# clang++ (scripts/test.sh).
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then export CXX=${CXX:-clang++}; fi
# Only what the demo runs: not the unit tests, benchmarks or tools (bash scripts/test.sh builds all).
BUILD_TARGETS="mmfeedd mmfeed-consume _mmfeed" bash scripts/build.sh -DMMFEED_TESTS=OFF
if [ -n "$SETUP" ]; then
  wait $SETUP || { cat "$DATA/setup.log"; echo "scripts/setup.sh --demo failed" >&2; exit 1; }
fi
/usr/bin/python3 scripts/make_dataset.py "$DATA" --count 2048
cp configs/demo.yaml "$DATA/demo.yaml"
# The socket in /tmp: a path in a deep clone may pass the 107 bytes a socket's path can have.
SOCK_DIR=$(mktemp -d /tmp/mmfeed-demo.XXXXXX)
trap 'rm -rf "$SOCK_DIR"' EXIT
SOCK="$SOCK_DIR/mmfeed.sock"
"$BUILD_DIR/bin/mmfeedd" --config "$DATA/demo.yaml" --socket "$SOCK" 2> "$DATA/daemon.log" &
DAEMON=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
"$BUILD_DIR/bin/mmfeed-consume" --socket "$SOCK" --rank 0 --json > "$DATA/rank0.json" &
C0=$!
"$BUILD_DIR/bin/mmfeed-consume" --socket "$SOCK" --rank 1 --json > "$DATA/rank1.json"
wait $C0
wait $DAEMON
echo "== consumers (one JSON line per rank) =="
cat "$DATA/rank0.json" "$DATA/rank1.json"
/usr/bin/python3 - "$DATA" <<'PY'
import json, sys
r = [json.load(open(f"{sys.argv[1]}/rank{i}.json")) for i in (0, 1)]
samples = sum(x["samples"] for x in r)
seconds = max(x["seconds"] for x in r)
print(f"== throughput: {samples} images+captions in {seconds:.2f}s = {samples / seconds:.0f} samples/s ==")
PY
echo "== daemon profile =="
sed -n '/mmfeedd profile:/,$p' "$DATA/daemon.log"
echo "== the trainer's side: examples/train_image_text.py's step, 40 steps of batch 32 =="
/usr/bin/python3 bench/train_loop_bench.py --build "$BUILD_DIR" --out "$DATA" --steps 40 --warmup 5 \
  > "$DATA/train.json"
/usr/bin/python3 - "$DATA/train.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, x in (("fed by mmfeed", r["mmfeed"]), ("fed by DataLoader(num_workers=2)", r["dataloader_2_workers"])):
    print(f"{name:34s} {x['steps_per_s']:6.1f} steps/s, waiting for data {100 * x['stall_share']:4.1f}% of the "
          f"step time (median {x['stall_ms_median']} ms a step)")
print(f"mmfeed: {r['steps_per_s_ratio']}x the steps per second, on the same files and cores")
PY
