#!/usr/bin/env bash
# The mailbox micro-benchmark side by side: bench/mailbox_bench.cc built against this tree's
# engine/mailbox.h and against BASE's (a git revision, default HEAD~1: pass the one before the
# mailbox change to measure), run in alternation on the same machine; each case's ratio is the
# median of the rounds' (new / base items per second; above 1: the tree is faster).
# usage: bench/mailbox_bench.sh [BASE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1} rounds=${2:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/base/engine"
git show "$base:engine/mailbox.h" > "$out/base/engine/mailbox.h"
flags=(-O2 -std=c++20 -pthread -I. bench/mailbox_bench.cc)
g++ -I"$out/base" "${flags[@]}" -o "$out/mailbox_base"
g++ "${flags[@]}" -o "$out/mailbox_new"
for r in $(seq "$rounds"); do
  "$out/mailbox_base" --rounds 1 | sed 's/^/base /' >> "$out/results"
  "$out/mailbox_new" --rounds 1 | sed 's/^/new /' >> "$out/results"
done
/usr/bin/python3 - "$out/results" "$base" <<'PY'
import collections, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, *name, rate = line.split()
    rates[(side, " ".join(name))].append(float(rate))
print(f"mailbox micro-benchmark: this tree vs {sys.argv[2]}, items/s (median of rounds)")
for name in dict.fromkeys(n for _, n in rates):
    b, n = statistics.median(rates[("base", name)]), statistics.median(rates[("new", name)])
    ratios = [x / y for x, y in zip(rates[("new", name)], rates[("base", name)])]
    print(f"  {name:14} base {b/1e6:6.2f} M/s  new {n/1e6:6.2f} M/s  ratio {statistics.median(ratios):.2f}x")
PY
