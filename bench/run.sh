#!/usr/bin/env bash
# Runs every benchmark with its baseline, on the same files, in one run:
#   bash bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench
CXX=g++ bash scripts/build.sh  # the compiler the benchmark pages' figures were measured with
/usr/bin/python3 bench/image_text_bench.py
/usr/bin/python3 bench/python_client_bench.py
/usr/bin/python3 bench/train_loop_bench.py
/usr/bin/python3 bench/audio_bench.py
/usr/bin/python3 bench/tokenizer_bench.py
/usr/bin/python3 bench/video_bench.py
/usr/bin/python3 bench/profile_bench.py
/usr/bin/python3 bench/autotune_bench.py
/usr/bin/python3 bench/qwen_bench.py
