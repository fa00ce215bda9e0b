#!/usr/bin/env bash
# A local cluster from real processes, the docker-compose topology on one machine:
# PostgreSQL, `prefect server` (UI on), Redis, an S3 endpoint, the model server, N process
# workers, the work pool and the deployments. Settings: deployments/cluster.env.
#
#   scripts/cluster.sh up [--workers N] [--models scripted|llama] [--state DIR]
#   scripts/cluster.sh status [--json]
#   scripts/cluster.sh down [--purge]
#
# The work is done by deployments/cluster.py (python -m refusalbench.deployments.cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -m refusalbench.deployments.cluster "$@"
