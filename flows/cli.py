"""The ``refusalbench`` command line.

Exit codes: 0 success, 1 run failure, 2 bad input or usage. Errors are one clean line
(``FILE:LINE: field: problem`` for bad input); ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import typer
from rich.console import Console

from refusalbench.flows.cli_api import api_app
from refusalbench.flows.cli_audit import audit_app
from refusalbench.flows.cli_config import VERSION_OPTION, config_app, init
from refusalbench.flows.cli_contamination import contamination
from refusalbench.flows.cli_data import data_app
from refusalbench.flows.cli_deploy import deploy

# The registry commands (levers, models) live in cli_registry; models_serve is named here for its callers.
from refusalbench.flows.cli_registry import DEFAULT_CONFIG, OutputFormat, levers_app, models_app, models_serve  # noqa: F401
from refusalbench.flows.cli_registry import config_path as _config_path
from refusalbench.flows.cli_results import (
    FAIL_UNDER_HELP,
    KNOWORNOT_FAIL_UNDER_HELP,
    knowornot_bars,
    print_leaderboard,
    print_rates,
    refusalbench_bars,
    round_folder,
)
from refusalbench.flows.cli_view import view
from refusalbench.flows.listing import ListFormat
from refusalbench.tasks.core.errors import InputError, InputErrors, ModelUnavailable, RunIncomplete
from refusalbench.tasks.core.plugins import load_entry_points
from refusalbench.tasks.pipeline import gc_tuning
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.runtime import configure_prefect_env

app = typer.Typer(
    help="RefusalBench: does your RAG model know when not to answer?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
knowornot_app = typer.Typer(help="KnowOrNot: out-of-knowledge-base robustness.", no_args_is_help=True)
app.add_typer(levers_app, name="levers")
app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")
app.add_typer(knowornot_app, name="knowornot")
app.add_typer(audit_app, name="audit")
app.add_typer(api_app, name="api")
app.add_typer(config_app, name="config")
app.command("init")(init)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class State:
    verbose = False


# The commands that start a flow; the others get the garbage collector back at once (tasks.gc_tuning).
FLOW_COMMANDS = {"run", "generate", "evaluate", "pretest", "refresh", "knowornot", "contamination"}


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks and debug logs."),
    version: bool = VERSION_OPTION,
) -> None:
    State.verbose = verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if ctx.invoked_subcommand not in FLOW_COMMANDS:
        gc_tuning.no_flow_ahead()


@knowornot_app.callback()
def _knowornot(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand != "run":
        gc_tuning.no_flow_ahead()


# ---------------------------------------------------------------- flows

FRESH_HELP = (
    "a role whose calls ignore earlier cache entries this run (repeatable): generation, pretest, targets, "
    "judge; its new replies are cached, so re-running into the same --out repeats none"
)


def _fresh(roles: list[str] | None) -> list[str]:
    """The ``--fresh`` roles, checked (exit 2 on an unknown one)."""
    from refusalbench.tasks.core.cache_policy import check_roles

    try:
        return check_roles(roles)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--fresh") from None


@app.command()
def generate(
    config: Path | None = typer.Option(None, "--config", help="run config (YAML)"),
    out_dir: str = typer.Option(..., "--out", help="run folder: local path or s3://bucket/prefix"),
    fresh: list[str] | None = typer.Option(None, "--fresh", metavar="ROLE", help=FRESH_HELP),
) -> None:
    """Generation flow: assign levers, generate, cross-verify, filter, sample -> benchmark.parquet."""
    from refusalbench.flows.launch import run_generation

    result = run_generation(str(_config_path(config)), out_dir, fresh=_fresh(fresh))
    out.print(f"benchmark: {result.benchmark}  ({result.accepted} accepted, {result.sampled} sampled)")


@app.command()
def evaluate(
    config: Path | None = typer.Option(None, "--config"),
    benchmark: str = typer.Option(..., "--benchmark", help="benchmark file (Parquet): local path or s3://..."),
    out_dir: str = typer.Option(..., "--out"),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="exit 1 when a target is incomplete (scored on less than evaluation.min_coverage of its rows)",
    ),
    fresh: list[str] | None = typer.Option(None, "--fresh", metavar="ROLE", help=FRESH_HELP),
    fail_under: list[str] | None = typer.Option(None, "--fail-under", metavar="METRIC=VALUE", help=FAIL_UNDER_HELP),
) -> None:
    """Evaluation flow: targets respond, judge scores, metrics and report."""
    from refusalbench.flows.launch import run_evaluation

    bars = refusalbench_bars(fail_under)  # a bad bar: exit 2 before any model call
    result = run_evaluation(str(_config_path(config)), benchmark, out_dir, _fresh(fresh))
    print_leaderboard(out, err, out_dir, result.report, bars, incomplete=(result, strict))


@app.command()
def score(
    files: list[Path] = typer.Argument(
        ...,
        metavar="FILE",
        help="judged responses (Parquet, JSONL or CSV), or "
        "inspect_ai eval logs (.eval/.json files or a log folder; several: one per model)",
    ),
    out_dir: Path = typer.Option(..., "--out"),
    bootstrap: int = typer.Option(1000, help="bootstrap resamples for 95% intervals"),
    seed: int = typer.Option(0),
) -> None:
    """Compute metrics from judged responses or inspect_ai eval logs (no model calls): DIR/metrics.json.

    From inspect logs (the refusalbench task's), DIR also gets judged.parquet and report.html.
    """
    from refusalbench.tasks.integrations.inspect.logs import is_inspect_log, score_inspect_logs

    logs = [is_inspect_log(f) for f in files]
    if any(logs):
        if not all(logs):
            bad = files[logs.index(False)]
            raise InputError(str(bad), "not an inspect eval log: give one judged-responses file, or inspect logs only")
        path, report_uri, excluded = score_inspect_logs(files, str(out_dir), bootstrap=bootstrap, seed=seed)
        for model, count in sorted(excluded.items()):
            err.print(
                f"note: {model}: {count} sample(s) left out of the metrics (the target or judge call failed)",
                markup=False,
                highlight=False,
            )
        out.print(f"metrics: {path}\nreport: {report_uri}")
        return
    if len(files) > 1:
        raise InputError(str(files[1]), "one judged-responses file at a time (several files: inspect eval logs only)")
    from refusalbench.tasks.refusalbench.report.run_outputs import score_to_folder

    path = score_to_folder(files[0], str(out_dir), bootstrap=bootstrap, seed=seed)
    out.print(f"metrics: {path}")


@app.command()
def report(run_dir: str = typer.Argument(..., help="run folder")) -> None:
    """(Re)build DIR/report.html from a run folder."""
    from refusalbench.tasks.refusalbench.report.run_outputs import build_report_for

    out.print(f"report: {build_report_for(run_dir)}")


# Explore what report and score wrote, item by item.
app.command("view")(view)
# Schedule refresh rounds of a config (served here or registered for a work pool).
app.command("deploy")(deploy)
# A static benchmark against a fresh round of its strata.
app.command("contamination")(contamination)


@app.command()
def export(
    run_dir: str = typer.Argument(..., help="run folder holding benchmark.parquet"),
    format: str = typer.Option("hf", "--format", help="hf: a Hugging Face datasets folder (Parquet + dataset card)"),
    out_dir: Path = typer.Option(..., "--out", help="export folder (local; must be new or empty unless --force)"),
    force: bool = typer.Option(False, "--force", help="replace README.md and data/ of a non-empty --out"),
    name: str | None = typer.Option(None, "--name", help="the card's pretty_name (default: from the run id)"),
    language: list[str] = typer.Option(["en"], "--language", help="language code of the items (repeatable)"),
) -> None:
    """Write the run's benchmark as a dataset: Parquet splits + README.md card written from the run."""
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run

    result = export_run(run_dir, out_dir, fmt=format, force=force, pretty_name=name, languages=language)
    for note in result.notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    configs = ", ".join(f"{c.name} ({c.rows})" for c in result.configs)
    out.print(
        f"exported {result.rows} items to {result.out}  (configs: {configs}; fill in the card's license)",
        highlight=False,
    )


@knowornot_app.command("run")
def knowornot_run(
    config: Path | None = typer.Option(None, "--config", help="default: the sample knowledge base on local models"),
    out_dir: str = typer.Option("runs/knowornot-demo", "--out"),
    fail_under: list[str] | None = typer.Option(
        None, "--fail-under", metavar="METRIC=VALUE", help=KNOWORNOT_FAIL_UNDER_HELP
    ),
) -> None:
    """The KnowOrNot pipeline end to end."""
    from refusalbench.flows.launch import run_knowornot

    bars = knowornot_bars(fail_under)  # a bad bar: exit 2 before any model call
    result = run_knowornot(str(_config_path(config, "knowornot-demo.yaml")), out_dir)
    print_rates(out, err, out_dir, result.report, bars)


@knowornot_app.command("label")
def knowornot_label(
    run_dir: str = typer.Argument(..., help="KnowOrNot run folder (local)"),
    annotator: str = typer.Option(..., "--annotator", help="your name or id"),
    spec: str = typer.Option(
        "abstention",
        "--spec",
        help="an evaluation spec: abstention, factuality or a registered "
        "one; ookb_validity: are the synthetic out-of-KB questions really outside the KB?",
    ),
    web: bool = typer.Option(False, "--web", help="serve a labelling page on loopback instead of the terminal"),
    port: int = typer.Option(8765, "--port"),
    consensus: bool = typer.Option(
        False,
        "--consensus",
        help="consensus pass: only the items the annotators labelled "
        "differently, with their labels; records the agreed label",
    ),
) -> None:
    """Label the stratified sample of a spec; every label is saved at once, a restart resumes."""
    import time

    from refusalbench.tasks.knowornot.human.label_screens import label_in_terminal, serve_labelling
    from refusalbench.tasks.knowornot.human.labels import open_label_session
    from refusalbench.tasks.knowornot.stages.ookb import OOKB_VALIDITY, open_validity_session

    # Validity labels are per synthetic question (App. D.2), not per response of the label sample.
    session = (
        open_validity_session(run_dir) if spec == OOKB_VALIDITY.name else open_label_session(run_dir, spec, consensus)
    )
    if web:
        server = serve_labelling(session.items, session.labels_path, annotator, port=port)
        out.print(f"labelling page: {server.url}  (Ctrl-C to stop)")
        try:
            while True:
                time.sleep(3600)
        finally:
            server.shutdown()
    new = label_in_terminal(session.items, session.labels_path, annotator)
    out.print(f"{len(new)} new labels saved to {session.labels_path}")


@knowornot_app.command("agreement")
def knowornot_agreement(
    run_dir: str = typer.Argument(..., help="KnowOrNot run folder (local)"),
    spec: str = typer.Option("abstention", "--spec"),
) -> None:
    """Cohen's/Fleiss' kappa between annotators and evaluator-vs-human agreement."""
    from refusalbench.tasks.knowornot.human.labels import write_agreement

    report = write_agreement(run_dir, spec)
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")


@app.command()
def run(
    config: Path | None = typer.Option(None, "--config", help="run config (default: the local demo)"),
    out_dir: str = typer.Option("runs/demo", "--out"),
    seed: int | None = typer.Option(None, "--seed", help="override generation.seed (another sample and lever draw)"),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="exit 1 when a target is incomplete (scored on less than evaluation.min_coverage of its rows)",
    ),
    fresh: list[str] | None = typer.Option(None, "--fresh", metavar="ROLE", help=FRESH_HELP),
    fail_under: list[str] | None = typer.Option(None, "--fail-under", metavar="METRIC=VALUE", help=FAIL_UNDER_HELP),
) -> None:
    """The main job: generate -> evaluate -> report (default config = local demo)."""
    from refusalbench.flows.launch import run_main

    bars = refusalbench_bars(fail_under)  # a bad bar: exit 2 before any model call
    result = run_main(str(_config_path(config)), out_dir, seed, _fresh(fresh))
    print_leaderboard(out, err, out_dir, result.report, bars, incomplete=(result, strict))


@app.command()
def refresh(
    config: Path | None = typer.Option(None, "--config", help="run config (default: the local demo)"),
    out_root: str = typer.Option("runs/rounds", "--out", help="folder holding one sub-folder per round"),
    compare: int = typer.Option(5, "--compare", help="how many recent rounds the trend shows"),
    seed: int | None = typer.Option(None, "--seed", help="fix the round's seed (default: a fresh random one)"),
    fail_under: list[str] | None = typer.Option(None, "--fail-under", metavar="METRIC=VALUE", help=FAIL_UNDER_HELP),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="exit 1 when a target of the round is incomplete (scored on less than evaluation.min_coverage "
        "of its rows; not compared in the trend)",
    ),
) -> None:
    """One refresh round: fresh sample and levers, generate, evaluate, compare with earlier rounds."""
    from refusalbench.flows.launch import run_refresh

    bars = refusalbench_bars(fail_under)  # a bad bar: exit 2 before any model call
    result = run_refresh(str(_config_path(config)), out_root, compare, seed)
    out.print(f"round {result.round}: report {result.report}")
    from refusalbench.tasks.refusalbench.rounds.trend import change_line

    for flag in result.flags:
        out.print(f"changed (significant at refresh.fdr): {change_line(flag.model_dump())}", highlight=False)
    if result.contamination:
        out.print(
            f"contamination: {result.contamination} (flagged: {', '.join(result.contamination_flagged) or 'none'})"
        )
    for round_id in result.incomplete_rounds:
        out.print(f"incomplete round, not in the trend: {round_id}", highlight=False)
    print_leaderboard(out, err, round_folder(out_root, result.round), result.report, bars, incomplete=(result, strict))


@app.command()
def pretest(
    config: Path | None = typer.Option(None, "--config", help="run config with generation.pretest"),
    out_dir: str = typer.Option(..., "--out", help="run folder: local path or s3://bucket/prefix"),
    fresh: list[str] | None = typer.Option(None, "--fresh", metavar="ROLE", help=FRESH_HELP),
) -> None:
    """The base-set pre-test on its own: which base items every pre-test model answers correctly."""
    from refusalbench.flows.launch import run_pretest

    result = run_pretest(str(_config_path(config)), out_dir, _fresh(fresh))
    funnel = " -> ".join(f"{step} {count}" for step, count in result.funnel.items())
    out.print(f"pretest: {result.pretest}  (base items: {funnel})", highlight=False)


@app.command()
def plan(
    config: Path | None = typer.Option(None, "--config", help="run config (default: the local demo)"),
    format: ListFormat = typer.Option(
        ListFormat.table, "--format", help="table, json (the whole plan) or csv (a row per stage and model)"
    ),
    latency: float = typer.Option(
        2.0,
        "--latency",
        min=0.001,
        help="seconds per call for the time bound, for models with no measured or registry speed",
    ),
    benchmark: str | None = typer.Option(
        None, "--benchmark", help="plan the evaluation of this benchmark file alone (exact respond counts)"
    ),
    all_models: bool = typer.Option(
        False, "--all-models", help="with skip_unavailable: plan every model, also those without credentials now"
    ),
    rounds: int | None = typer.Option(
        None,
        "--rounds",
        min=1,
        help="refresh rounds T the error bound covers "
        "(default: the config's refresh.rounds); prints the round size it needs",
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", min=1e-6, help="error tolerance (default 0.05)"),
    delta: float | None = typer.Option(
        None, "--delta", min=1e-12, max=0.999999, help="failure probability (default: refresh.delta)"
    ),
    per_stratum: bool = typer.Option(False, "--per-stratum", help="the size for epsilon in every stratum"),
) -> None:
    """Calls, tokens, cost and time a run would take with an empty cache; no model is called. With --rounds:
    the items per round that Theorem 3.1 requires, and whether the config's target_size meets it."""
    from refusalbench.flows.cli_plan import plan_output

    sys.stdout.write(
        plan_output(
            _config_path(config),
            fmt=format,
            latency=latency,
            benchmark=benchmark,
            all_models=all_models,
            rounds=rounds,
            epsilon=epsilon,
            delta=delta,
            per_stratum=per_stratum,
        )
        + "\n"
    )


# ---------------------------------------------------------------- entry point


def _is_usage_error(exc: BaseException) -> bool:
    # Typer vendors its own click; its ClickException family carries show() and exit_code.
    return any(cls.__name__ in ("ClickException", "UsageError") for cls in type(exc).__mro__) and hasattr(exc, "show")


def _echo_progress(title: str, done: int, total: int) -> None:
    err.print(f"[dim]{title}: {done}/{total}[/dim]", highlight=False)


def main(argv: list[str] | None = None) -> None:
    configure_prefect_env()
    import refusalbench.tasks.pipeline.ui as ui_artifacts

    ui_artifacts.PROGRESS_ECHO = _echo_progress
    # A CLI process a worker started for a flow run ends with that worker (nothing happens elsewhere).
    follow_parent()
    try:
        load_entry_points()  # installed plugins, also for the commands that read no config (score, models ...)
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            raise SystemExit(code)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        err.print("aborted")
        raise SystemExit(1) from None
    except typer.BadParameter as exc:
        exc.show()
        raise SystemExit(2) from None
    except InputErrors as exc:
        if State.verbose:
            traceback.print_exc()
        for line in exc.lines():
            err.print(line, markup=False, highlight=False)
        raise SystemExit(2) from None
    except (InputError, ModelUnavailable) as exc:
        if State.verbose:
            traceback.print_exc()
        err.print(str(exc), markup=False, highlight=False)
        raise SystemExit(2) from None
    except RunIncomplete as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None
    except Exception as exc:
        if _is_usage_error(exc):
            exc.show()  # type: ignore[attr-defined]
            raise SystemExit(2) from None
        if State.verbose:
            traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        err.print(f"error: {type(exc).__name__}: {first}", markup=False, highlight=False)
        raise SystemExit(1) from None


def command() -> None:
    """The ``refusalbench`` process: ``main`` with the garbage collector tuned for a short-lived
    process (``tasks.gc_tuning``); in-process callers use ``main`` and keep theirs as it was."""
    gc_tuning.start_up()
    try:
        main()
    finally:
        gc_tuning.at_exit()


if __name__ == "__main__":  # pragma: no cover
    command()
