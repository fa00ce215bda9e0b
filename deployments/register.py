"""Register RefusalBench on a Prefect server in one process: what ``deployments/register.sh`` runs.

    python -m refusalbench.deployments.register --pool refusalbench \\
        --deployment refresh config_path=deployments/cluster.yaml out_root=s3://bucket/refresh \\
        --deployment evaluate config_path=deployments/cluster.yaml

The work pool (type process) if it is missing, then each ``--deployment NAME PARAM=VALUE ...`` of
the prefect file with those parameters (register.sh then runs deployments/automations.py).
Each deployment goes through Prefect's own ``prefect --no-prompt deploy --name NAME --pool POOL
--param ...`` command, run in this interpreter: the deployments are exactly what that command makes,
and the flows, Prefect's CLI and LiteLLM are imported once rather than once per deployment (one
``prefect deploy`` process per deployment took 5-9 s each; ``--param`` applies to one selected
deployment, so ``--all`` cannot give each its own). Stops with a non-zero exit at the first failure.
Run it from the project root: entrypoints and config paths are relative to it, as on the workers.
"""

from __future__ import annotations

import argparse

DEFAULT_PREFECT_FILE = "deployments/prefect.yaml"


def prefect_cli(*tokens: str) -> None:
    """One ``prefect TOKENS`` command in this process; a failed one raises SystemExit with its code."""
    from prefect.cli._app import _app

    try:
        _app.meta(list(tokens), result_action="return_value")
    except SystemExit as done:
        if done.code not in (0, None):
            raise


def work_pool_exists(pool: str) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            return False
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", default="refusalbench", help="the work pool (default %(default)s)")
    parser.add_argument("--prefect-file", default=DEFAULT_PREFECT_FILE, help="default %(default)s")
    parser.add_argument(
        "--deployment",
        nargs="+",
        action="append",
        required=True,
        metavar="NAME [PARAM=VALUE ...]",
        help="a deployment of the prefect file and the parameters it is registered with",
    )
    args = parser.parse_args(argv)
    for name, *parameters in args.deployment:
        bad = [p for p in parameters if "=" not in p]
        if bad:
            parser.error(f"--deployment {name}: {bad[0]!r} is not PARAM=VALUE")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The pool first: the cluster starts its workers once it exists (deployments/cluster.py).
    if work_pool_exists(args.pool):
        print(f"work pool {args.pool}: exists", flush=True)
    else:
        prefect_cli("work-pool", "create", args.pool, "--type", "process")
    for name, *parameters in args.deployment:
        print(f"deployment {name}: {' '.join(parameters)}", flush=True)
        prefect_cli(
            "--no-prompt",
            "deploy",
            "--prefect-file",
            args.prefect_file,
            "--name",
            name,
            "--pool",
            args.pool,
            *[token for parameter in parameters for token in ("--param", parameter)],
        )


if __name__ == "__main__":
    main()
