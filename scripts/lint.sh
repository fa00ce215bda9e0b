#!/usr/bin/env bash
# Lint, format check and type check, as CI runs them: bash scripts/lint.sh
# (needs the test extra: bash scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
# mypy checks the code under its installed names (refusalbench.tasks.core, ...). The editable
# install reaches those names through an import hook mypy does not follow, so a link tree in
# .mypy_src gives them a place on disk.
rm -rf .mypy_src && mkdir -p .mypy_src/refusalbench
for folder in flows tasks deployments levers prompts configs extend; do
  [ -d "$folder" ] && ln -s "../../$folder" ".mypy_src/refusalbench/$folder"
done
(cd .mypy_src && "../$BIN/mypy" --config-file ../pyproject.toml -p refusalbench)
