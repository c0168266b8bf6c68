#!/usr/bin/env bash
# Soak test: bench/soak.sh [SECONDS] (default 600). Builds, then runs bench/soak.py against the
# real daemon: consumers SIGKILLed and restarted at random, 5% bad files, a slow consumer;
# checks order, duplicates, accounting, RSS and fds, and prints the figures as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
PY=/usr/bin/python3
exec "$PY" bench/soak.py --bin build/bin --seconds "${1:-600}"
