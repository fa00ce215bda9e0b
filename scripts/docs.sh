#!/usr/bin/env bash
# Build the documentation site strictly (a warning, a broken link or a page missing from the
# navigation fails the build) into a temporary folder, which is removed afterwards.
#
#   bash scripts/docs.sh            # needs the docs extra, which scripts/setup.sh installs
set -euo pipefail
export NO_MKDOCS_2_WARNING=1   # Material prints an end-of-life notice on every build otherwise
cd "$(dirname "$0")/.."
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
.venv/bin/mkdocs build --strict --quiet -d "$OUT"
echo "docs built: $(find "$OUT" -name '*.html' | wc -l) pages"
