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

from refusalbench.flows.listing import FORMAT_HELP, Column, ListFormat, print_listing
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

audit_app = typer.Typer(help="Human audit of generated items (the paper's App. C.2).", no_args_is_help=True)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

SAMPLE_COLUMNS = [
    Column("stratum", keep=True),
    Column("in_benchmark", "in benchmark"),
    Column("sampled"),
    Column("short", "short", drop=1),
]
REPORT_COLUMNS = [
    Column("group", "class / intensity", keep=True),
    Column("n"),
    Column("shown_rate", "pass rate"),
    Column("shown_interval", "95% interval", keep=True, drop=1),
]


def _note(format: ListFormat, line: str) -> None:
    """A line after the table: on stdout beside a table, on stderr beside CSV or JSON (which stay parseable)."""
    (out if format == ListFormat.table else err).print(line, markup=False, highlight=False)


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
    format: ListFormat = typer.Option(ListFormat.table, "--format", help=FORMAT_HELP),
) -> None:
    """Draw the audit sample from the benchmark: N per class x intensity stratum, shuffled."""
    from refusalbench.tasks.refusalbench.audit.human_audit import sample_run

    counts = sample_run(run_dir, per_stratum, seed, force)
    rows = [
        {
            "stratum": stratum,
            "in_benchmark": c["available"],
            "sampled": c["sampled"],
            "short": c["sampled"] < per_stratum,
        }
        for stratum, c in counts.items()
    ]
    total = sum(c["sampled"] for c in counts.values())
    print_listing(rows, SAMPLE_COLUMNS, format, title=f"audit sample: {total} items (seed {seed})")
    _note(format, f"saved to {rb_files.AUDIT_SAMPLE.name} in {run_dir}")


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
def audit_report(
    run_dir: str = typer.Argument(..., help="run folder with audit labels (local)"),
    format: ListFormat = typer.Option(ListFormat.table, "--format", help=FORMAT_HELP),
) -> None:
    """Pass rate per class and intensity (95% Wilson intervals), kappa, agreement with the verifiers."""
    from refusalbench.tasks.refusalbench.audit.human_audit import write_audit
    from refusalbench.tasks.refusalbench.report.leaderboard import format_interval, format_value

    audit, report = write_audit(run_dir)
    rows = [
        {
            "group": rate.value,
            "n": rate.n,
            "passed": rate.passed,
            "pass_rate": rate.pass_rate,
            "ci_low": rate.ci_low,
            "ci_high": rate.ci_high,
            "shown_rate": format_value(rate.pass_rate, "pass_rate"),
            "shown_interval": format_interval(_interval(rate.ci_low, rate.ci_high), "pass_rate"),
        }
        for rate in [*audit.by_class, *audit.by_intensity, audit.overall]
    ]
    title = f"human audit: {audit.overall.n} items, {len(audit.labels_per_annotator)} annotator(s)"
    if format == ListFormat.table:
        print_listing(rows, REPORT_COLUMNS, format, title=title)
    else:  # the numbers for programs; the shown text is the table's
        print_listing([{k: v for k, v in r.items() if not k.startswith("shown_")} for r in rows], [], format)
    agreement = audit.annotator_agreement
    if agreement.get("kappa_kind"):
        kind = "Cohen's" if agreement["kappa_kind"] == "cohen" else "Fleiss'"
        _note(
            format,
            f"{kind} kappa between annotators: {_kappa(agreement['kappa'])} over {agreement['kappa_items']} items",
        )
    consensus = audit.verifier_agreement.get("consensus")
    if consensus:
        _note(
            format,
            f"humans vs verifier consensus: {format_value(consensus['percent_agreement'], 'agreement')} agreement"
            f" over {consensus['n']} items, kappa {_kappa(consensus['kappa'])}",
        )
    _note(format, f"audit: {rb_files.AUDIT.name} in {run_dir}")
    _note(
        format,
        f"report: {report}"
        if report
        else "report: not rebuilt (no judged responses yet); the evaluation's report will include the audit",
    )
