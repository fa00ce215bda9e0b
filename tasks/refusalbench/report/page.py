"""The report page: what it shows (:class:`ReportInputs`) and how it is put together.

:func:`build_report` returns one self-contained HTML string: CSS inline, charts as Vega-Lite specs
with their data, drawn by the Vega JavaScript inlined once in the head (``core.charts``). A section
whose table is absent is left out. The page opens with the summary card (:mod:`.summary_card`)
and a table of contents linking every section; intervals, standard errors and significance marks
follow the small-sample guardrail (:mod:`.support`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.html_page import CSS, escape, frame_table, mapping_html, section, table_of_contents
from refusalbench.tasks.refusalbench.report.audit_section import audit_html
from refusalbench.tasks.refusalbench.report.calibration_section import calibration_section
from refusalbench.tasks.refusalbench.report.comparison_figures import comparison_figures_html
from refusalbench.tasks.refusalbench.report.cost_section import cost_section
from refusalbench.tasks.refusalbench.report.coverage_section import coverage_section
from refusalbench.tasks.refusalbench.report.decision_section import decision_section
from refusalbench.tasks.refusalbench.report.figures import (
    class_intensity_chart,
    confusion_chart,
    intensity_curves,
    refusal_error_bars,
    scatter_plot,
)
from refusalbench.tasks.refusalbench.report.generation_figures import FIGURE_KEYS, generation_figures_html
from refusalbench.tasks.refusalbench.report.guarded_tables import breakdown_tables, leaderboard_html
from refusalbench.tasks.refusalbench.report.gv import base_sample_domains_html, gv_section_html, unverified_note
from refusalbench.tasks.refusalbench.report.headings import heading
from refusalbench.tasks.refusalbench.report.leaderboard import (
    INTERVAL_NOTE,
    SIGNIFICANCE_NOTE,
    incomplete_models,
    leaderboard_metrics,
    ranked_models,
)
from refusalbench.tasks.refusalbench.report.outcomes import (
    correlation_note,
    distribution_section,
    multi_document_section,
    standard_errors_section,
)
from refusalbench.tasks.refusalbench.report.pairwise_section import pairwise_section
from refusalbench.tasks.refusalbench.report.paper_figures import paper_figures
from refusalbench.tasks.refusalbench.report.reference_section import leaderboard_beside, reference_section
from refusalbench.tasks.refusalbench.report.responses import responses_section
from refusalbench.tasks.refusalbench.report.summary_card import metadata_section, summary_section
from refusalbench.tasks.refusalbench.report.support import GUARDRAIL_NOTE, ClusterSupport
from refusalbench.tasks.refusalbench.report.trend_section import trend_section
from refusalbench.tasks.refusalbench.scoring import ScoreResult
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE


@dataclasses.dataclass
class ReportInputs:
    """What a report shows. Only ``metrics`` is required; absent tables skip their section."""

    metrics: Mapping[str, Mapping[str, float]]
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)
    breakdown: pd.DataFrame | None = None
    confusion: pd.DataFrame | None = None
    calibration: pd.DataFrame | None = None
    class_intensity: pd.DataFrame | None = None
    refusal_by_intensity: pd.DataFrame | None = None
    champions: pd.DataFrame | None = None
    manifest: Mapping[str, Any] | None = None
    gv_analysis: Mapping[str, Any] | None = None
    generation_counts: Mapping[str, Any] | None = None  # the generate manifest's counts (default: manifest's)
    round_trend: pd.DataFrame | None = None
    trend: Mapping[str, Any] | None = None  # trend.json of a refresh round (changes, incomplete rounds)
    audit: Mapping[str, Any] | None = None  # audit.json (human audit of generated items)
    title: str = "RefusalBench report"
    generated_at: str | None = None
    standard_errors: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    response_distribution: pd.DataFrame | None = None
    frr_mrr_correlation: Mapping[str, Any] | None = None
    multi_document: Mapping[str, Mapping[str, int]] | None = None
    # Registry entries per model (family, parameters_b, training, thinking_budget); default:
    # the manifest's ``config.models``.
    model_info: Mapping[str, Mapping[str, Any]] | None = None
    # Rows per outcome per model, and the scored share below which a model is incomplete.
    outcomes: Mapping[str, Mapping[str, int]] | None = None
    min_coverage: float = DEFAULT_MIN_COVERAGE
    # responses.parquet: the replies, their reasoning and reasoning tokens (a sample and a per-model table).
    responses: pd.DataFrame | None = None
    # Standard errors with rows resampled as if independent (shown beside the cluster ones), and
    # metrics.json's pairwise block (rank ranges, the leader's group, the pairwise table).
    standard_errors_iid: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    pairwise: Mapping[str, Any] | None = None
    # judged.parquet (confusion by intensity) and benchmark.parquet (items per domain): the paper figures.
    judged: pd.DataFrame | None = None
    benchmark: pd.DataFrame | None = None
    # Where the confidences came from (the calibration pass or the scored responses) and, per model,
    # the share of them at maximum confidence with their accuracy (``scoring.calibration``).
    calibration_source: str | None = None
    max_confidence: Mapping[str, Mapping[str, Any]] | None = None
    # The benchmark's question, answers and expected behaviour of the items the reply sample shows.
    items: pd.DataFrame | None = None

    @classmethod
    def from_score(cls, result: ScoreResult, **optional: Any) -> ReportInputs:
        """Inputs from a ScoreResult; ``optional`` sets manifest, gv_analysis, round_trend, audit, title."""
        return cls(
            metrics=result.metrics,
            intervals=result.intervals,
            breakdown=result.breakdown,
            confusion=result.confusion,
            calibration=result.calibration,
            class_intensity=result.class_intensity,
            refusal_by_intensity=result.refusal_by_intensity,
            champions=result.champions,
            generated_at=result.generated_at,
            standard_errors=result.standard_errors,
            standard_errors_iid=result.standard_errors_iid,
            pairwise=result.pairwise or None,
            response_distribution=result.response_distribution,
            frr_mrr_correlation=result.frr_mrr_correlation,
            multi_document=result.multi_document,
            outcomes=result.outcomes,
            min_coverage=result.min_coverage,
            calibration_source=result.calibration_source,
            max_confidence=result.max_confidence,
            **optional,
        )


def _non_empty(frame: pd.DataFrame | None) -> bool:
    return frame is not None and not frame.empty


def _base_set_section(run: ReportInputs) -> str | None:
    """The base-set funnel (imported -> pretested -> kept -> sampled) and the pre-test per model."""
    counts = run.generation_counts or (run.manifest or {}).get("counts") or {}
    funnel = counts.get("base_set_funnel")
    if not funnel:
        return None
    body = (
        "<p>Base items at each step: imported (the base set), pre-tested (answered unperturbed by every "
        "pre-test model), kept (all of them answered correctly), sampled (drawn for generation).</p>"
        + mapping_html(funnel, heading=heading)
    )
    by_model = counts.get("pretest_by_model")
    if by_model:
        frame = pd.DataFrame.from_dict(by_model, orient="index")
        frame.insert(0, "model", frame.index.astype(str))
        body += "<h3>Pre-test answers per model</h3>" + frame_table(frame)
    body += base_sample_domains_html(counts)
    return section("Base set", body)


def _generation_sections(run: ReportInputs) -> list[str]:
    """Base set, generation figures, the G-V analysis and the human audit: what generation left."""
    sections = [s for s in [_base_set_section(run)] if s]
    if run.gv_analysis:
        sections.append(section("Benchmark generation", generation_figures_html(run.gv_analysis)))
        tables = {k: v for k, v in run.gv_analysis.items() if k not in FIGURE_KEYS}  # those are drawn above
        sections.append(section("Generator × verifier analysis", gv_section_html(tables)))
    if run.audit:
        sections.append(section("Human audit of generated items", audit_html(run.audit)))
    return sections


def _comparison_section(run: ReportInputs) -> str:
    registry = (
        run.model_info if run.model_info is not None else ((run.manifest or {}).get("config") or {}).get("models")
    )
    return section("Model comparison", comparison_figures_html(run.metrics, run.breakdown, registry))


def _summary(run: ReportInputs, support: ClusterSupport) -> str:
    return summary_section(
        manifest=run.manifest,
        gv_analysis=run.gv_analysis,
        metrics=run.metrics,
        min_coverage=run.min_coverage,
        outcomes=run.outcomes,
        benchmark=run.benchmark,
        support=support,
    )


def _page(run: ReportInputs, sections: Sequence[str]) -> str:
    """The page: title, stamp, the table of contents of ``sections`` (the summary card first), then them."""
    stamp = f"<p class='note'>Generated {escape(run.generated_at)}</p>" if run.generated_at else ""
    contents, sections = table_of_contents(sections)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(run.title)}</title>"
        f"<style>{CSS}</style>{charts.head_script(''.join(sections))}</head><body><h1>{escape(run.title)}</h1>{stamp}{contents}"
        + "".join(sections)
        + "</body></html>\n"
    )


def build_generation_report(run: ReportInputs) -> str:
    """The report of a run with no scores (after ``generate``): what generation made, and its metadata."""
    sections = [_summary(run, ClusterSupport())]
    sections += _generation_sections(run) + list(filter(None, [cost_section(run.manifest)]))
    if run.manifest:
        sections.append(metadata_section(run.manifest))
    return _page(run, sections)


def build_report(run: ReportInputs) -> str:
    """The whole report as one self-contained HTML string."""
    order = ranked_models(run.metrics, run.min_coverage)
    support = ClusterSupport(run.judged, run.benchmark, run.metrics, run.breakdown, run.pairwise)
    sections: list[str] = [_summary(run, support)]

    lead = (
        f"<p>{len(order)} model(s). Ranked by calibrated refusal score (CRS = mean of answer "
        "accuracy and refusal accuracy); brackets are bootstrap 95% intervals; — = undefined.</p>"
        f"<p class='note'>Intervals and standard errors: {escape(INTERVAL_NOTE)}"
        + (f" {escape(SIGNIFICANCE_NOTE)}" if run.pairwise else "")
        + f" {escape(GUARDRAIL_NOTE)}</p>"
    )
    incomplete = incomplete_models(run.metrics, run.min_coverage)
    if incomplete:
        lead += (
            f"<p class='note'>{len(incomplete)} model(s) scored on less than {100 * run.min_coverage:.0f}% of "
            "their rows are incomplete: listed after the ranked models, without a rank (see Rows not scored).</p>"
        )
    columns = [name for name, _ in leaderboard_metrics(run.metrics)]
    beside = leaderboard_beside(run.metrics, run.multi_document, columns)  # the paper's figures, matched models
    board = leaderboard_html(run.metrics, run.intervals, run.pairwise, run.min_coverage, support, beside)
    sections.append(section("Leaderboard", lead + unverified_note(run.gv_analysis) + board))
    coverage = coverage_section(run.metrics, run.outcomes, run.min_coverage, order)
    if coverage:
        sections.append(coverage)
    sections.extend(filter(None, [decision_section(run.manifest, order)]))
    sections.extend(
        filter(
            None,
            [
                standard_errors_section(run.standard_errors, order, run.standard_errors_iid, support),
                pairwise_section(run.pairwise, order, support),
                multi_document_section(run.metrics, run.intervals, run.multi_document, order, support),
            ],
        )
    )

    scatter_a = (
        run.metrics,
        "answer_accuracy",
        "refusal_accuracy",
        "Answer vs refusal accuracy",
        "answer accuracy (answerable items)",
        "refusal accuracy (unanswerable items)",
    )
    scatter_b = (
        run.metrics,
        "detection_f1",
        "category_accuracy",
        "Refusal detection vs categorisation",
        "detection F1 (whether to refuse)",
        "category accuracy (why, given a correct refusal)",
    )
    sections.append(
        section(
            "Answering vs refusing",
            "<div class='figs'>"
            + charts.or_note(scatter_plot(*scatter_a), "answer vs refusal accuracy scatter")
            + charts.or_note(scatter_plot(*scatter_b), "detection F1 vs category accuracy scatter")
            + "</div>",
        )
    )

    bars = charts.or_note(refusal_error_bars(run.metrics, order), "false and missed refusal rate bars")
    sections.append(section("False vs missed refusals", bars + correlation_note(run.frr_mrr_correlation)))
    distribution = distribution_section(run.response_distribution, order, support)
    if distribution:
        sections.append(distribution)
    replies = responses_section(run.responses, order, run.judged, run.items)
    if replies:
        sections.append(replies)

    if _non_empty(run.class_intensity):
        body = "<p>Share of correct responses per class and intensity (LOW items are answerable).</p>"
        sections.append(section("Perturbation class × intensity", body + class_intensity_chart(run.class_intensity)))

    intensity = run.refusal_by_intensity
    if not _non_empty(intensity) and run.breakdown is not None and _non_empty(run.breakdown):
        part = run.breakdown[(run.breakdown["group"] == "intensity") & (run.breakdown["metric"] == "refusal_rate")]
        intensity = part.rename(columns={"value": "intensity", "estimate": "refusal_rate"})
    if _non_empty(intensity):
        sections.append(section("Refusal rate by intensity", intensity_curves(intensity)))

    paper = paper_figures(run, order)  # dashboards, rankings, domains, confusion across models
    sections.extend(paper.sections)
    if _non_empty(run.confusion):
        sections.append(section("Confusion matrices (expected × predicted)", confusion_chart(run.confusion)))

    sections.append(
        calibration_section(run.metrics, run.calibration, run.max_confidence, run.calibration_source, order)
    )

    if _non_empty(run.breakdown):
        tables = breakdown_tables(run.breakdown, support)
        if tables:
            sections.append(section("Breakdowns", tables))

    if _non_empty(run.champions):
        sections.append(section("Domain champions", frame_table(run.champions)))
    sections.append(_comparison_section(run))
    sections.append(reference_section())

    if run.round_trend is not None and not run.round_trend.empty:
        sections.append(trend_section(run.round_trend, run.trend))

    sections.extend(_generation_sections(run))
    sections.extend(filter(None, [paper.left_out_section(), cost_section(run.manifest)]))

    if run.manifest:
        sections.append(metadata_section(run.manifest))

    return _page(run, sections)
