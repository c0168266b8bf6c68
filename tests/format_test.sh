#!/usr/bin/env bash
# Fails on any C++ or CUDA file of the repository that .clang-format would change, naming it
# and the command that fixes it. usage: format_test.sh SOURCE_DIR
set -u
cd "$1" || exit 1
command -v clang-format >/dev/null || { echo "clang-format not found (scripts/setup.sh installs it)"; exit 1; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.cu')
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted by .clang-format (fix: clang-format -i ${bad[*]}):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format ok"
