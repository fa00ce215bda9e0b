#!/usr/bin/env bash
# Everything CI checks, in order: lint and types (scripts/lint.sh), the documentation site
# (scripts/docs.sh, mkdocs --strict), then the test suite. Run after scripts/setup.sh.
# Extra arguments go to pytest (e.g. bash scripts/check.sh -x tests/refusalbench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/lint.sh
bash scripts/docs.sh
.venv/bin/python -m pytest -q "$@"
