#!/usr/bin/env bash
# scripts/setup.sh for a user who is not root and has no sudo: it must say what to run as root
# before it changes anything, not fail inside apt. Run as nobody (setpriv) when the test runs
# as root; the PATH holds no sudo, a dpkg-query that reports every package missing and an
# apt-get that only records that it was called. Once as `bash setup.sh`, once as `sh setup.sh`
# (dash), which must hand it to bash.
# usage: setup_test.sh SOURCE_DIR
set -u
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
mkdir "$dir/bin"
cp "$src/scripts/setup.sh" "$dir/setup.sh"
for tool in bash id grep awk sort comm; do ln -s "$(command -v $tool)" "$dir/bin/$tool"; done
printf '#!/bin/sh\necho "deinstall ok not-installed"\n' > "$dir/bin/dpkg-query"
printf '#!/bin/sh\necho "$*" >> %s/apt-calls\n' "$dir" > "$dir/bin/apt-get"
chmod 755 "$dir/bin/dpkg-query" "$dir/bin/apt-get"
as_user=()
if [ "$(id -u)" = 0 ]; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
fail=0
for run in "bash --build-only" "sh --demo"; do
  read -r shell args <<< "$run"
  out=$(cd "$dir" && "${as_user[@]}" env -i PATH="$dir/bin" "$(command -v "$shell")" "$dir/setup.sh" \
    "$args" 2>&1)
  rc=$?
  if [ $rc != 1 ] || [[ "$out" != *"needs root, and sudo is not installed"* ]] ||
    [[ "$out" != *"su -c 'bash scripts/setup.sh --demo'"* ]]; then
    echo "$shell setup.sh $args without root or sudo: exit $rc, said:"; echo "$out"; fail=1
  fi
done
if [ -e "$dir/apt-calls" ]; then
  echo "setup.sh called apt-get before it found it could not install:"; cat "$dir/apt-calls"
  fail=1
fi
[ $fail = 0 ] && echo "setup without sudo ok"
exit $fail
