#!/usr/bin/env bash
# Makes the Debian package $BUILD_DIR/mmfeed_<version>_amd64.deb (BUILD_DIR: build) from a
# Release build (made if missing) with CPack's DEB generator, then runs lintian on it, failing
# on any warning (scripts/deb/lintian-overrides says why each override is there). CPack over
# dpkg-buildpackage: the package is the `cmake --install` tree the project already defines and
# tests, so there is no second install list to keep in step; scripts/deb/ holds the rest.
# Usage: scripts/package.sh [--no-lintian]
set -euo pipefail
cd "$(dirname "$0")/.."
# The changelog's date: the last commit's, so that the same tree makes the same package.
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git rev-parse --git-dir > /dev/null 2>&1; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)"
  export SOURCE_DATE_EPOCH
fi
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -x "$BUILD_DIR/bin/mmfeedd" ] || [ ! -d "$BUILD_DIR/python/mmfeed" ]; then
  BUILD_DIR="$BUILD_DIR" bash scripts/build.sh
fi
(cd "$BUILD_DIR" && cpack -G DEB)
deb="$(ls -t "$BUILD_DIR"/mmfeed_*_amd64.deb | head -1)"
echo "package: $deb"
if [ "${1:-}" != --no-lintian ]; then
  lintian --fail-on warning --info "$deb"
  echo "lintian: no warning"
fi
