#!/usr/bin/env bash
# Refreshes the vendored uPlot files in assets/ from npm. Go builds never run
# this: the files are committed, so the binary embeds them without Node.
#   usage: internal/web/refresh-uplot.sh [version]   (default: the pinned one)
set -euo pipefail
version="${1:-1.6.32}"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$version" >/dev/null && tar xzf "uplot-$version.tgz")
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$here/assets/"
cp "$tmp/package/LICENSE" "$here/assets/uPlot.LICENSE"
echo "uplot $version (npm pack uplot@$version): uPlot.iife.min.js, uPlot.min.css, uPlot.LICENSE (MIT)" >"$here/assets/VERSIONS"
