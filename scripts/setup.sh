#!/usr/bin/env bash
# One-step set-up on a fresh machine: a project virtualenv in .venv with everything
# the project needs, installed from the project's own files (pyproject.toml + constraints.txt).
#
#   bash scripts/setup.sh           # the package + test tools + inspect_ai + the docs tools (refusalbench[inspect,docs])
#   bash scripts/setup.sh --local   # ... plus llama.cpp (refusalbench[local]) for local models
#
# The llama.cpp build takes ~11 minutes on 2 cores; the built wheel is kept in
# $REFUSALBENCH_WHEELHOUSE (default ~/.cache/refusalbench/wheelhouse) so it is built once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
LOCAL=0
for arg in "$@"; do
  case "$arg" in
    --local) LOCAL=1 ;;
    *) echo "usage: bash scripts/setup.sh [--local]" >&2; exit 2 ;;
  esac
done

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "pip>=24" "setuptools>=69" wheel
# CPU torch first: a plain 'torch' requirement would pull a multi-GB CUDA build.
"${PIP[@]}" install "torch==2.13.0"
# The inspect extra is installed too: tests/integrations/test_inspect.py runs an inspect_ai eval; and the docs
# extra: tests/test_docs.py builds the documentation site.
EXTRAS="test,inspect,docs"
FIND_LINKS=()
if [ "$LOCAL" = 1 ]; then
  WHEELHOUSE=${REFUSALBENCH_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/refusalbench/wheelhouse}
  mkdir -p "$WHEELHOUSE"
  LLAMA_VERSION=$(sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
  if ! ls "$WHEELHOUSE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_VERSION (once; ~11 min on 2 cores)..."
    # Portable CPU build: the cached wheel must run on any x86-64 machine it is copied to.
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "${PIP[@]}" wheel --no-deps -w "$WHEELHOUSE" "llama-cpp-python==$LLAMA_VERSION"
  fi
  EXTRAS="$EXTRAS,local"
  FIND_LINKS=(--find-links "$WHEELHOUSE")
fi
# One resolver run for every extra (a second run for the local extra took ~15 s more to resolve again).
"${PIP[@]}" install -c constraints.txt "${FIND_LINKS[@]}" -e ".[$EXTRAS]"
# An editable install is not byte-compiled, and where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines) every command would compile the project's modules anew (~0.3 s
# of each command's start-up on 2 cores): compile them once here, as pip does for an
# ordinary install. A module edited later is recompiled in memory, never run stale.
.venv/bin/python -m compileall -q flows tasks deployments levers prompts >/dev/null
echo "set-up done: .venv"
