#!/usr/bin/env bash
# Checks the include layering of docs/design/architecture.md ("Layers") and what the binaries link.
# The order is one way: base <- shm <- source <- engine <- stages <- daemon; client/ uses shm/
# and base/ only. A folder may include its own files and those of the folders before it.
# usage: layering_test.sh SOURCE_DIR BIN_DIR
set -u
src=$1 bin=$2 fail=0
check() {  # folder, forbidden include prefixes
  if hits=$(grep -rnE "#include \"($2)" "$src/$1"); then
    echo "$1/ must not include $2:"; echo "$hits"; fail=1
  fi
}
check base 'shm/|source/|engine/|stages/|daemon/|client/'
check shm 'source/|engine/|stages/|daemon/|client/'
check source 'engine/|stages/|daemon/|client/'
check engine 'stages/|daemon/|client/'
check stages 'daemon/|client/'
check client 'source/|engine/|stages/|daemon/'
# The daemon asks the engine (the registry, Stage, batch transforms such as text packing), never
# a stage's own folder: a stage is reached through its registration only.
check daemon 'stages/'
# Stage families share code through stages/common/ (and FFmpeg input through stages/ffmpeg/),
# never through each other's folders.
for family in image text audio video ffmpeg common; do
  others=$(ls "$src/stages" | grep -vxE "$family|common|ffmpeg" | sed 's|$|/|' | paste -sd'|')
  [ "$family" = common ] && others=$(ls "$src/stages" | grep -vx common | sed 's|$|/|' | paste -sd'|')
  [ "$family" = ffmpeg ] && others=$(ls "$src/stages" | grep -vxE 'ffmpeg|common' | sed 's|$|/|' | paste -sd'|')
  check "stages/$family" "stages/($others)"
done
# What a trainer links (the client library) and what the control tool links: no daemon library.
for b in mmfeed-consume mmfeedctl; do
  libs=$(ldd "$bin/$b") || { echo "ldd $b failed"; exit 1; }
  if echo "$libs" | grep -E 'yaml-cpp|spdlog|libnuma|libcurl|libav|libsw|opencv|turbojpeg'; then
    echo "$b links a daemon library (the engine, the source layer or a codec)"; fail=1
  fi
done
[ $fail = 0 ] && echo "layering ok"
exit $fail
