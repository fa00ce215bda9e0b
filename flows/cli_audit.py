"""``refusalbench audit``: the human audit of a run's generated items (seed paper App. C.2).

``audit sample`` draws N benchmark items per class x intensity stratum; ``audit label``
asks an annotator for PASS/FAIL against the verifiers' rubric, in the terminal or on a
loopback web page (saved after every label; a restart resumes); ``audit report`` writes
``audit.json`` (pass rate per class and intensity with Wilson intervals, kappa between
annotators, agreement with the verifier consensus) and rebuilds the run's report.
Bad input raises ``InputError``, which the root command line turns into exit 2.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

audit_app = typer.Typer(help="Human audit of generated items (the paper's App. C.2).", no_args_is_help=True)

out = Console(soft_wrap=True)


def _kappa(value: float | None) -> str:
    return "undefined" if value is None or value != value else f"{value:.3f}"


def _interval(low: float | None, high: float | None) -> tuple[float, float] | None:
    """(low, high), or None (shown as "") when a bound is undefined, as for a stratum without labels."""
    return None if low is None or high is None else (low, high)


@audit_app.command("sample")
def audit_sample(
    run_dir: str = typer.Argument(..., help="run folder holding benchmark.parquet"),
    per_stratum: int = typer.Option(10, "--per-stratum", help="items drawn from every class x intensity stratum"),
    seed: int = typer.Option(0, "--seed", help="the same seed draws the same sample"),
    force: bool = typer.Option(False, "--force", help="replace a sample that already has labels"),
) -> None:
    """Draw the audit sample from the benchmark: N per class x intensity stratum, shuffled."""
    from refusalbench.tasks.refusalbench.audit.human_audit import sample_run

    counts = sample_run(run_dir, per_stratum, seed, force)
    table = Table(title=f"audit sample: {sum(c['sampled'] for c in counts.values())} items (seed {seed})")
    for column in ("stratum", "in benchmark", "sampled"):
        table.add_column(column)
    for stratum, count in counts.items():
        short = " (short)" if count["sampled"] < per_stratum else ""
        table.add_row(stratum, str(count["available"]), f"{count['sampled']}{short}")
    out.print(table)
    out.print(f"saved to {rb_files.AUDIT_SAMPLE.name} in {run_dir}", highlight=False)


@audit_app.command("label")
def audit_label(
    run_dir: str = typer.Argument(..., help="run folder with an audit sample (local)"),
    annotator: str = typer.Option(..., "--annotator", help="your name or id"),
    web: bool = typer.Option(False, "--web", help="serve an audit page on loopback instead of the terminal"),
    port: int = typer.Option(8766, "--port", help="port of the audit page (loopback)"),
) -> None:
    """Audit the sample: PASS or FAIL per item against the verifier rubric; saved at once, resumable."""
    from refusalbench.tasks.refusalbench.audit.audit_screens import audit_in_terminal, serve_audit
    from refusalbench.tasks.refusalbench.audit.human_audit import open_audit_session

    session = open_audit_session(run_dir)
    if web:
        server = serve_audit(session.cases, session.labels_path, annotator, port=port)
        out.print(f"audit page: {server.url}  (Ctrl-C to stop)", highlight=False)
        try:
            while True:
                time.sleep(3600)
        finally:
            server.shutdown()
    new = audit_in_terminal(session.cases, session.labels_path, annotator)
    out.print(f"{len(new)} new labels saved to {session.labels_path}", highlight=False)


@audit_app.command("report")
def audit_report(run_dir: str = typer.Argument(..., help="run folder with audit labels (local)")) -> None:
    """Pass rate per class and intensity (95% Wilson intervals), kappa, agreement with the verifiers."""
    from refusalbench.tasks.refusalbench.audit.human_audit import write_audit
    from refusalbench.tasks.refusalbench.report.leaderboard import format_interval, format_value

    audit, report = write_audit(run_dir)
    table = Table(title=f"human audit: {audit.overall.n} items, {len(audit.labels_per_annotator)} annotator(s)")
    for column in ("class / intensity", "n", "pass rate", "95% interval"):
        table.add_column(column)
    for rate in [*audit.by_class, *audit.by_intensity, audit.overall]:
        table.add_row(
            rate.value,
            str(rate.n),
            format_value(rate.pass_rate, "pass_rate"),
            format_interval(_interval(rate.ci_low, rate.ci_high), "pass_rate"),
        )
    out.print(table)
    agreement = audit.annotator_agreement
    if agreement.get("kappa_kind"):
        kind = "Cohen's" if agreement["kappa_kind"] == "cohen" else "Fleiss'"
        out.print(
            f"{kind} kappa between annotators: {_kappa(agreement['kappa'])} over {agreement['kappa_items']} items",
            highlight=False,
        )
    consensus = audit.verifier_agreement.get("consensus")
    if consensus:
        out.print(
            f"humans vs verifier consensus: {format_value(consensus['percent_agreement'], 'agreement')} agreement"
            f" over {consensus['n']} items, kappa {_kappa(consensus['kappa'])}",
            highlight=False,
        )
    out.print(f"audit: {rb_files.AUDIT.name} in {run_dir}", highlight=False)
    out.print(
        f"report: {report}"
        if report
        else "report: not rebuilt (no judged responses yet); the evaluation's report will include the audit",
        highlight=False,
    )
