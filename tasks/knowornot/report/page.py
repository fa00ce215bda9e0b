"""The KnowOrNot report page, built from a run folder: one self-contained ``report.html``.

Sections: what the filters kept; abstention and factuality of the leave-one-out questions per
retrieval x prompt x target as figures with 95% intervals and as a table; the synthetic
out-of-KB questions apart (``report_ookb``); the outcomes of every further
evaluation spec; the label sample and the agreement of its annotators with each other and
with the evaluator (from ``agreement-<spec>.json``, when the labels are in); the
duplicate-overlap audit of the question set; the run's counts. The page opens with a summary
card (``run_summary``) and a table of contents; a rate judged on fewer than
``core.stats.MIN_CLUSTERS`` responses shows "insufficient data (n = K)" in place of its
interval. ``write_knowornot_report``
reads everything from the run folder, so the page can be rebuilt at any time (the
agreement command does, once new agreement is computed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from pydantic import ValidationError

from refusalbench.tasks.core import charts, runfolder
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.html_page import CSS, escape, frame_table, section, table_of_contents
from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.core.stats import enough_clusters
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.human.evaluator_comparison import comparison_html
from refusalbench.tasks.knowornot.report.figures import outcome_shares, overlap_histogram, rate_bars
from refusalbench.tasks.knowornot.report.ookb_section import synthetic_ookb_html
from refusalbench.tasks.knowornot.report.run_summary import summary_html
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.json_files import AgreementDocument, OverlapAudit
from refusalbench.tasks.knowornot.stages.evaluation import ABSTENTION, BUILT_IN_SPECS, FACTUALITY
from refusalbench.tasks.knowornot.stages.ookb import OOKB_VALIDITY, validity_summary

RATE_NOTE = (
    "Leave-one-out questions (synthetic out-of-KB ones have their own section below). "
    "abstention rate = abstained / responses judged; factuality rate = (tier_1 + tier_2) / answered "
    "responses judged (the paper's definition); 95% seeded percentile-bootstrap intervals."
)


@dataclasses.dataclass
class KnowOrNotReportInputs:
    """What the page shows; everything but ``metrics`` may be missing (its section says so)."""

    metrics: pd.DataFrame
    filter_report: Mapping[str, Any]
    metrics_by_base: pd.DataFrame | None = None  # multi-base runs: the same rates per knowledge base
    counts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    specs: Sequence[EvalSpec] = BUILT_IN_SPECS
    spec_rates: pd.DataFrame | None = None
    overlap: OverlapAudit | None = None
    label_sample_size: int | None = None
    label_sample_per_spec: Mapping[str, int] = dataclasses.field(default_factory=dict)  # rows drawn for each spec
    agreements: Mapping[str, AgreementDocument] = dataclasses.field(default_factory=dict)
    labels_per_spec: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    synthetic_ookb: pd.DataFrame | None = None  # the synthetic out-of-KB questions' rates (their own experiment)
    ookb_validity: Sequence[Mapping[str, Any]] = ()  # their validity labels per annotator (ookb.validity_summary)
    manifest: Mapping[str, Any] | None = None  # manifest.json (the summary card)


def write_knowornot_report(store: ArtifactStore, counts: Mapping[str, Any] | None = None) -> str:
    """(Re)build ``report.html`` of a finished KnowOrNot run from its folder; returns its URI."""
    document = store.load(kon_files.KON_METRICS)
    specs = store.load(kon_files.RUN_SPECS).root if store.has(kon_files.RUN_SPECS) else list(BUILT_IN_SPECS)
    manifest = store.load(runfolder.MANIFEST) if store.has(runfolder.MANIFEST) else None
    if counts is None:
        counts = manifest.counts if manifest is not None else {}
    agreements = {
        s.name: store.load(kon_files.agreement_file(s.name))
        for s in specs
        if store.has(kon_files.agreement_file(s.name))
    }
    labels = {
        s.name: _labels_per_annotator(store.read_text(kon_files.labels_file(s.name).name))
        for s in specs
        if store.has(kon_files.labels_file(s.name))
    }
    sample = store.load(kon_files.LABEL_SAMPLE) if store.has(kon_files.LABEL_SAMPLE) else None
    inputs = KnowOrNotReportInputs(
        metrics=store.load(kon_files.KON_METRICS_TABLE),
        filter_report=document.filter_report,
        metrics_by_base=pd.DataFrame(document.configurations_by_knowledge_base)
        if document.configurations_by_knowledge_base
        else None,
        counts=counts,
        specs=specs,
        spec_rates=store.load(kon_files.SPEC_RATES) if store.has(kon_files.SPEC_RATES) else None,
        overlap=document.overlap_audit,
        label_sample_size=len(sample) if sample is not None else None,
        label_sample_per_spec=sample.groupby(kon_files.LABEL_SAMPLE_SPEC).size().to_dict()
        if sample is not None and kon_files.LABEL_SAMPLE_SPEC in sample.columns
        else {},
        agreements=agreements,
        labels_per_spec=labels,
        synthetic_ookb=pd.DataFrame(document.synthetic_ookb) if document.synthetic_ookb else None,
        ookb_validity=validity_summary(store.read_text(kon_files.labels_file(OOKB_VALIDITY.name).name))
        if store.has(kon_files.labels_file(OOKB_VALIDITY.name))
        else (),
        manifest=manifest.model_dump(mode="json") if manifest is not None else None,
    )
    return store.save(runfolder.REPORT, knowornot_report(inputs))


def _labels_per_annotator(jsonl: str) -> dict[str, int]:
    """Items labelled per annotator in a labels file (a line that does not parse is not counted: this only informs)."""
    items: dict[str, set[str]] = {}
    for line in jsonl.splitlines():
        try:
            label = HumanLabel.model_validate_json(line)
        except ValidationError:
            continue
        items.setdefault(label.annotator, set()).add(label.item_id)
    return {annotator: len(ids) for annotator, ids in items.items()}


def knowornot_report(inputs: KnowOrNotReportInputs) -> str:
    """The self-contained HTML page (no script, images inline)."""
    sections = [
        summary_html(inputs.manifest, inputs.metrics, inputs.counts, inputs.filter_report, _bases(inputs)),
        section("Abstention and factuality per configuration", _rates_html(inputs)),
        section(
            "Synthetic out-of-KB questions (their own experiment)",
            synthetic_ookb_html(inputs.synthetic_ookb, inputs.ookb_validity),
        ),
        section("Factuality tiers and the run's own evaluation specs", _specs_html(inputs)),
        section("Human labels and agreement", _agreement_html(inputs)),
        section("Duplicate-overlap audit of the question set", _overlap_html(inputs)),
        section("Counts", _counts_html(inputs.counts)),
    ]
    contents, sections = table_of_contents(sections)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>KnowOrNot report</title>"
        f"<style>{CSS}</style>{charts.head_script(''.join(sections))}</head>"
        "<body><h1>KnowOrNot: out-of-knowledge-base robustness</h1>"
        f"<p>{escape(_filter_line(inputs.filter_report, inputs.counts, _bases(inputs)))}</p>{contents}"
        f"{''.join(sections)}</body></html>"
    )


def _bases(inputs: KnowOrNotReportInputs) -> int:
    frame = inputs.metrics_by_base
    return 1 if frame is None or frame.empty else int(frame["knowledge_base"].nunique())


def _filter_line(report: Mapping[str, Any], counts: Mapping[str, Any], bases: int = 1) -> str:
    used = counts.get("qa_pairs", report.get("n_kept"))
    cut = f", of which the first {used} were used (max_questions)" if used != report.get("n_kept") else ""
    where = (
        f"over a knowledge base of {used} QA pairs"
        if bases == 1
        else f"within each of {bases} knowledge bases, {used} QA pairs in all"
    )
    # Each base filters with its own settings (e.g. `filters: []` for a released, already filtered set).
    per_base = "; ".join(
        f"{b['knowledge_base']} {b['method']}"
        + "".join(
            f" {name} {b[f'{name}_threshold']}"
            for name in ("keyword", "semantic")
            if b.get(f"{name}_threshold") is not None
        )
        + f", kept {b['n_kept']} of {b['n_input']}"
        for b in report.get("by_knowledge_base") or []
    )
    return (
        f"Leave-one-out {where}: the diversity filters kept {report.get('n_kept')} "
        f"of {report.get('n_input')}{cut}; the keyword filter removed {report.get('removed_keyword')}, the "
        f"semantic filter {report.get('removed_semantic')} (filters: {report.get('method')}"
        + (f"; per base: {per_base}" if per_base else "")
        + ")."
    )


def _rates_html(inputs: KnowOrNotReportInputs) -> str:
    metrics = inputs.metrics
    if metrics.empty:
        return '<p class="note">The run has no evaluated responses.</p>'
    answered = int(metrics["n_answered"].sum())
    figures = [
        _figure_or_reason(
            rate_bars(
                metrics,
                "abstention_rate",
                "abstention_ci_low",
                "abstention_ci_high",
                "Abstention rate per retrieval strategy and system prompt",
                "abstention rate",
            ),
            "abstention rate per retrieval x prompt x target",
            f"No abstention figure: none of the {int(metrics['n'].sum())} responses got a readable "
            "abstention verdict (see the error column of evaluations.parquet).",
        ),
        _figure_or_reason(
            rate_bars(
                metrics,
                "factuality_rate",
                "factuality_ci_low",
                "factuality_ci_high",
                "Factuality rate of the answered responses",
                "factuality rate",
            ),
            "factuality rate per retrieval x prompt x target",
            "No factuality figure: no response was judged as answered."
            if not answered
            else f"No factuality figure: the evaluator gave no readable tier for any of the {answered} answered "
            "responses (see the error column of evaluations.parquet).",
        ),
    ]
    per_base = (
        ""
        if inputs.metrics_by_base is None
        else (
            "<h3>Per knowledge base</h3><p>Each base is its own leave-one-out (its own index); the figures and the "
            f"table above pool the bases.</p>{_rates_table(inputs.metrics_by_base)}"
        )
    )
    return f"<p>{escape(RATE_NOTE)}</p><div class='figs'>{''.join(figures)}</div>{_rates_table(metrics)}{per_base}"


def _rates_table(metrics: pd.DataFrame) -> str:
    table = metrics.copy()
    for name in ("abstention", "factuality"):
        judged = table[f"n_{name}_judged"] if f"n_{name}_judged" in table.columns else [None] * len(table)
        table[f"{name} (95% CI)"] = [
            _rate_with_interval(r, lo, hi, n)
            for r, lo, hi, n in zip(table[f"{name}_rate"], table[f"{name}_ci_low"], table[f"{name}_ci_high"], judged)
        ]
    shown = [
        "knowledge_base",
        "target",
        "retrieval",
        "prompt",
        "n",
        "n_abstention_judged",
        "abstention (95% CI)",
        "n_answered",
        "n_factuality_judged",
        "factuality (95% CI)",
    ]
    return frame_table(table[[c for c in shown if c in table.columns]])


def _figure_or_reason(encoded: str | None, alt: str, reason: str) -> str:
    """The figure, or one line saying why it could not be drawn."""
    del alt  # the chart carries its own description
    return encoded or charts.note(reason)


def _rate_with_interval(rate: Any, low: Any, high: Any, n_judged: Any = None) -> str:
    """A rate with its interval; judged on fewer than MIN_CLUSTERS responses (``n_judged``), the
    guardrail's words instead of the interval."""
    if rate is None or pd.isna(rate):
        return "–"
    if pd.isna(low) or pd.isna(high):
        return f"{rate:.3f}"
    if n_judged is not None and not pd.isna(n_judged) and not enough_clusters(int(n_judged)):
        return f"{rate:.3f} (insufficient data (n = {int(n_judged)}))"
    return f"{rate:.3f} [{low:.3f}, {high:.3f}]"


def _specs_html(inputs: KnowOrNotReportInputs) -> str:
    """Factuality's tiers, then each spec of the run's own: its outcome shares drawn and tabulated."""
    rates = inputs.spec_rates if inputs.spec_rates is not None else pd.DataFrame()
    parts = []
    for spec in inputs.specs:
        if spec.name == ABSTENTION.name:
            continue  # its two outcomes are the abstention rate above
        scope = "every response" if spec.applies_to == "all" else "the responses judged as answered"
        parts.append(
            f"<h3>Evaluation spec <code>{escape(spec.name)}</code></h3><p>Outcomes {escape(', '.join(spec.outcomes))} given in "
            f"&lt;{escape(spec.tag)}&gt; tags, for {scope}; share of the responses judged.</p>"
        )
        if spec.name != FACTUALITY.name and not rates.empty:
            parts.append(
                _figure_or_reason(
                    outcome_shares(rates, spec.name, spec.outcomes),
                    f"outcomes of {spec.name}",
                    f"No figure: no response got a readable <{spec.tag}> verdict.",
                )
            )
        parts.append(_outcome_table(rates, spec))
    if all(s.name in (ABSTENTION.name, FACTUALITY.name) for s in inputs.specs):
        parts.append(
            "<p>This run applied only the built-in specs. Add your own under <code>knowornot.evaluations"
            "</code> in the config: name, tag, outcomes, prompt, and optionally input_fields and "
            "applies_to (all | answered).</p>"
        )
    return "".join(parts)


def _outcome_table(rates: pd.DataFrame, spec: EvalSpec) -> str:
    """One row per configuration, one column per outcome: its share with the 95% interval."""
    part = rates[rates["spec"] == spec.name] if not rates.empty else rates
    if part.empty:
        return "<p>No outcomes recorded for this spec.</p>"
    keys = ["target", "retrieval", "prompt"]
    rows = []
    for key, group in part.groupby(keys, sort=True):
        row = dict(zip(keys, key)) | {"n judged": int(group["n_judged"].iloc[0])}
        for record in group.itertuples(index=False):
            row[record.outcome] = _rate_with_interval(record.rate, record.ci_low, record.ci_high, record.n_judged)
        rows.append(row)
    return frame_table(pd.DataFrame(rows, columns=[*keys, "n judged", *spec.outcomes]))


def _agreement_html(inputs: KnowOrNotReportInputs) -> str:
    size = inputs.label_sample_size
    per_spec = ", ".join(f"{escape(spec)} {n}" for spec, n in inputs.label_sample_per_spec.items())
    drawn = (
        f"{per_spec} responses, each spec's drawn from the responses it applies to (factuality: answered ones only)"
        if per_spec
        else f"{size if size is not None else 'none'} responses"
    )
    parts = [
        f"<p>Label sample: {drawn}, evenly across the "
        "configurations (the paper labelled 200, each by two annotators). Label with "
        "<code>refusalbench knowornot label RUN --annotator NAME [--spec SPEC]</code>; settle the "
        "disagreements with <code>... label RUN --annotator NAME --spec SPEC --consensus</code>; "
        "<code>refusalbench knowornot agreement RUN [--spec SPEC]</code> computes the agreement and "
        "rebuilds this page.</p>"
    ]
    for spec, counts in inputs.labels_per_spec.items():
        if not counts:
            continue
        given = ", ".join(f"{escape(a)}: {n}" for a, n in sorted(counts.items()))
        parts.append(f"<p>Labels given for <b>{escape(spec)}</b>: {given}.</p>")
    if not inputs.agreements:
        parts.append("<p>No agreement computed yet for this run.</p>")
    for spec, document in inputs.agreements.items():
        annotators = document.annotators
        pairs = [
            {
                "annotators": pair.replace("|", " vs "),
                "items": r.get("n"),
                "agreement": r.get("percent_agreement"),
                "agreement 95% CI": _interval(r.get("percent_agreement_ci")),
                "Cohen's kappa": r.get("kappa"),
                "kappa 95% CI": _interval(r.get("kappa_ci")),
            }
            for pair, r in (annotators.get("pairwise") or {}).items()
        ]
        versus = [
            {
                "human": who,
                "items": r.get("n"),
                "agreement": r.get("percent_agreement"),
                "Cohen's kappa": r.get("kappa"),
            }
            for who, r in document.evaluator_vs_human.items()
        ]
        parts.append(
            f"<h3>Agreement on <code>{escape(spec)}</code></h3><p>Annotators: {escape(', '.join(annotators.get('annotators', [])))}; "
            f"Fleiss' kappa {_number(annotators.get('fleiss_kappa'))} over {annotators.get('fleiss_items', 0)} "
            "items labelled by all.</p>"
        )
        if pairs:
            parts.append("<p>Between annotators:</p>" + frame_table(pd.DataFrame(pairs)))
        if versus:
            parts.append(
                "<p>Evaluator against each annotator and against their consensus:</p>"
                + frame_table(pd.DataFrame(versus))
            )
        parts.append(comparison_html(document.evaluator_comparison, document.disagreements_open))
    return "".join(parts)


def _interval(bounds: Sequence[float] | None) -> str:
    return "–" if not bounds else f"[{_number(bounds[0])}, {_number(bounds[1])}]"


def _number(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{float(value):.3f}"


_overlap_figures: dict[str, str | None] = {}  # the last audit's histogram, by the audit's JSON


def overlap_figure(audit: OverlapAudit) -> str | None:
    """The audit's nearest-similarity histogram (a chart's HTML), built once per audit in this process: a run
    builds it beside its calls (``audit_beside_calls``), so its report only looks it up."""
    key = audit.model_dump_json()
    if key not in _overlap_figures:
        figure = overlap_histogram(
            {"TF-IDF": audit.nearest_tfidf, "embedding": audit.nearest_embedding},
            {"TF-IDF": [lv.threshold for lv in audit.tfidf], "embedding": [lv.threshold for lv in audit.embedding]},
        )
        _overlap_figures.clear()  # one audit's at a time: a long-lived process makes many
        _overlap_figures[key] = figure
    return _overlap_figures[key]


def _overlap_html(inputs: KnowOrNotReportInputs) -> str:
    audit = inputs.overlap
    if audit is None:
        return '<p class="note">This run folder holds no overlap audit (made before the audit existed).</p>'
    levels = [
        {
            "measure": measure,
            "similarity ≥": level.threshold,
            "questions overlapping": level.n_overlapping,
            "overlap rate": level.overlap_rate,
        }
        for measure, rows in (("TF-IDF cosine", audit.tfidf), (f"embedding cosine ({audit.embedder})", audit.embedding))
        for level in rows
    ]
    pairs = pd.DataFrame([p.model_dump() for p in audit.most_similar])
    figure = overlap_figure(audit)
    parts = [
        f"<p>The paper checked by hand whether any question of its sets overlapped another (App. D.1: 0–1.5%). "
        f"Here each of the {audit.n_questions} kept questions is compared with every other: it overlaps at a "
        "threshold when another question is at least that similar. Before the audit the filters removed "
        f"{audit.removed_keyword} (keyword) and {audit.removed_semantic} (semantic) of {audit.n_input} pairs.</p>",
        frame_table(pd.DataFrame(levels)),
    ]
    if figure:
        parts.append(figure)
    if len(pairs):
        parts.append("<h3>Most similar pairs (check these by hand)</h3>" + frame_table(pairs))
    return "".join(parts)


def _counts_html(counts: Mapping[str, Any]) -> str:
    if not counts:
        return "<p>No counts recorded.</p>"
    return "<ul>" + "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in counts.items()) + "</ul>"
