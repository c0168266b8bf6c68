#!/usr/bin/env bash
# Sets everything up and runs every test: installs the Debian packages, builds in Release with
# g++, runs ctest; then runs the demo (scripts/demo.sh, less its apt step) on its own clang++
# build; then builds the tests with ASan+UBSan and runs them again; then builds the libFuzzer
# targets with clang and runs each for a short while on its seed corpus.
# MMFEED_SKIP_DEMO=1 / MMFEED_SKIP_SANITIZERS=1 / MMFEED_SKIP_FUZZ=1 skip the last three parts;
# MMFEED_FUZZ_SECONDS (15) is each fuzzer's time.
# Started with sh (dash)? bash runs it: the script needs bash's arrays and pipefail.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
CXX=g++ bash scripts/build.sh -DMMFEED_TESTS=ON  # (the demo's build leaves them off in the cache)
(cd build && ctest --output-on-failure -j2)
if [ "${MMFEED_SKIP_DEMO:-0}" != 1 ]; then
  BUILD_DIR=build-demo MMFEED_DEMO_SETUP=0 bash scripts/demo.sh
fi
if [ "${MMFEED_SKIP_SANITIZERS:-0}" != 1 ]; then
  # One file at a time here (the Release build above is a unity build): both ways compile.
  BUILD_DIR=build-asan CXX=g++ bash scripts/build.sh -DMMFEED_SANITIZE=ON -DCMAKE_UNITY_BUILD=OFF
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     ctest --output-on-failure -j2)
fi
if [ "${MMFEED_SKIP_FUZZ:-0}" != 1 ]; then
  fuzzers="config image source ring_reader ring_control control_protocol tokenizer tokenizer_json video cursor stream_state parquet"
  # Only the fuzzers (and the libraries they link): the daemon and tools are not run from here.
  BUILD_DIR=build-fuzz BUILD_TARGETS="$(printf 'fuzz_%s ' $fuzzers)" \
    CXX=clang++ bash scripts/build.sh -DMMFEED_FUZZ=ON -DMMFEED_TESTS=OFF \
      -DCMAKE_UNITY_BUILD=OFF
  seeds=build-fuzz/seeds
  rm -rf "$seeds" && mkdir -p "$seeds"/{config,image,source,ring_reader,ring_control,control_protocol,tokenizer,tokenizer_json,video,cursor,stream_state,parquet}
  head -c 200 /dev/urandom > "$seeds/ring_control/random"
  cp configs/*.yaml "$seeds/config/"
  cp tests/data/photos/photo0[0-3]*.jpg tests/data/photos/*.png "$seeds/image/"
  printf '{"id": "a", "image": "x.jpg", "text": "t"}\n' > "$seeds/source/manifest.jsonl"
  printf '{"id": "a", "image": ["x.jpg", {"path": "y.jpg"}], "text": ["t", "u"]}\n' > "$seeds/source/lists.jsonl"
  printf '{"id": "a", "image": "x.jpg", "text": "t"}\r\n\n  \n{"image": "y.jpg", "text": "u"}' > "$seeds/source/blank-lines.jsonl"
  (cd "$seeds" && printf 'a caption' > k.txt && printf '{}' > k.json && tar -cf source/shard.tar k.txt k.json \
     && rm k.txt k.json)
  head -c 4000 tests/data/tokenizer/corpus.txt > "$seeds/tokenizer/corpus-head.txt"
  cp tests/data/tokenizer/tiny-tokenizer.json "$seeds/tokenizer_json/"
  printf '{"cmd": "attach", "rank": 1, "resume": {"seq": 7, "epoch": 0, "batch": 7}}' > "$seeds/control_protocol/attach"
  printf '{"cmd": "status"}' > "$seeds/control_protocol/status"
  printf '{"epoch": 0, "batch": 2, "seq": 2, "stream": 7, "order": 9, "position": 16}' > "$seeds/cursor/honest"
  printf '{"epoch": 0, "batch": 2, "seq": 2, "stream": 7, "order": 9, "position": 2100, "lanes": 2}' \
    > "$seeds/cursor/past-the-end"
  printf '{"epoch": 1, "seq": 30}' > "$seeds/cursor/seq"
  printf '%s' '{"version": 2, "pipeline": "p", "fingerprint": "f", "origin": {"epoch": 1, "batch": 0, "seq": 8, "stream": 3, "base": 5, "base_lanes": 2}, "ranks": [{"epoch": 1, "batch": 2, "seq": 10, "stream": 3}], "config": {"file": "p.yaml", "text": "x"}, "mix_switches": [{"epoch": 0, "position": 4, "weights": [1, 2]}]}' \
    > "$seeds/stream_state/v2"
  # Parquet seeds: DuckDB's files (every codec, row groups, nested columns), written fresh.
  node tests/data/parquet/write_files.mjs build-tools/node_modules/@duckdb/node-api "$seeds/parquet"
  rm -f "$seeds/parquet"/*.json
  printf '{"cmd": "reload", "config": "/etc/mmfeed/pipeline.yaml"}' > "$seeds/control_protocol/reload"
  printf '{"cmd": "profile", "seconds": 2.5, "trace": true}' > "$seeds/control_protocol/profile"
  { cat configs/demo.yaml; printf 'metrics: {listen: "127.0.0.1:9464"}\nsample_timeout_s: 30\n'; } \
    > "$seeds/config/service.yaml"
  { sed 's/workers: 2/workers: auto/' configs/demo.yaml; printf 'cpu_budget: 4\nfaults: {stage: image, read_delay_ms: 1}\n'; } \
    > "$seeds/config/tuned.yaml"
  # Video seeds: a mode byte (0 uniform, 1 clip, 2 keyframes, 3 qwen_video) then a tiny video
  # per container.
  for v in "0 mp4 libx264" "1 mkv libx264" "2 webm libvpx-vp9" "3 mov libx264"; do
    read -r mode ext codec <<< "$v"
    ffmpeg -v error -y -f lavfi -i testsrc2=size=32x24:rate=10:duration=1 -c:v "$codec" -g 4 "$seeds/video/v.$ext"
    { printf "\\x0$mode"; cat "$seeds/video/v.$ext"; } > "$seeds/video/seed-$ext" && rm "$seeds/video/v.$ext"
  done
  for t in $fuzzers; do
    echo "fuzzing $t for ${MMFEED_FUZZ_SECONDS:-15}s"
    if ! ./build-fuzz/bin/fuzz_$t -max_total_time="${MMFEED_FUZZ_SECONDS:-15}" -rss_limit_mb=4096 \
        "$seeds/$t" > "build-fuzz/fuzz_$t.log" 2>&1; then
      tail -60 "build-fuzz/fuzz_$t.log"
      echo "fuzz_$t found a crash"
      exit 1
    fi
    tail -1 "build-fuzz/fuzz_$t.log"
  done
fi
