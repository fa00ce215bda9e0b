#!/usr/bin/env bash
# Lint, format check and type check, as CI runs them: bash scripts/lint.sh
# (needs the test extra: bash scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
# mypy checks the code under its installed names (refusalbench.tasks.core, ...). The editable
# install reaches those names through an import hook mypy does not follow, so a link tree in a
# temporary folder (one per run: two runs at once do not trip over each other) gives them a place
# on disk; the cache stays in the project.
ROOT=$(pwd)
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
mkdir -p "$SRC/refusalbench"
for folder in flows tasks deployments levers prompts configs extend; do
  [ -d "$folder" ] && ln -s "$ROOT/$folder" "$SRC/refusalbench/$folder"
done
(cd "$SRC" && "$ROOT/$BIN/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.mypy_cache" -p refusalbench)
