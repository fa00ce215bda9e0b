"""RefusalBench's files in a run folder, each declared once (its part of the public data contract).

Every file a RefusalBench run writes is an :class:`~refusalbench.tasks.core.runfolder.Artifact`
here: its name, format, shape (a record of ``records.py`` or a document of ``documents.py``)
and one line saying what it is. Code reads and writes them through these declarations
(``store.save(rb_files.BENCHMARK, items)``), so no file name is spelled out anywhere else.
The files both methods write (manifest, report) are declared in ``tasks/core/runfolder.py``.
"""

from __future__ import annotations

from refusalbench.tasks.core.runfolder import Artifact, RunManifest
from refusalbench.tasks.refusalbench.schema.json_files import (
    AuditDocument,
    AuditLabel,
    FilterDecisions,
    FreshnessDocument,
    GVAnalysis,
    MetricsDocument,
    TrendDocument,
)
from refusalbench.tasks.refusalbench.schema.records import (
    Assignment,
    BaseItem,
    BenchmarkItem,
    Candidate,
    Judgment,
    PretestRow,
    Response,
    Verification,
)

# ---------------------------------------------------------------- RefusalBench: generate
PRETEST = Artifact(
    "pretest.parquet",
    "parquet",
    "the base-set pre-test: one row per base item x pre-test model (answer, judge score, correct, kept, "
    "outcome, what the answer and judge calls cost)",
    PretestRow,
)
BASE_ITEMS = Artifact("base_items.parquet", "parquet", "the base items drawn for this run", BaseItem)
ASSIGNMENTS = Artifact("assignments.parquet", "parquet", "lever assignment: base item x stratum x lever", Assignment)
CANDIDATES = Artifact(
    "candidates.parquet",
    "parquet",
    "every generation attempt, failures, raw text and pre-check outcome included",
    Candidate,
)
VERIFICATIONS = Artifact(
    "verifications.parquet",
    "parquet",
    "one row per pre-checked candidate x verifier: verdict (effective and stated), consistency, criteria, raw",
    Verification,
)
FILTER_DECISIONS = Artifact(
    "filter_decisions.json", "json", "the consensus filter's decision per candidate", FilterDecisions
)
BENCHMARK = Artifact("benchmark.parquet", "parquet", "the accepted, stratified benchmark items", BenchmarkItem)
GV_ANALYSIS = Artifact(
    "gv_analysis.json",
    "json",
    "generator x verifier pass rates, self-evaluation bias, kappa, "
    "verdict consistency, pre-check rejections, funnel, the matched-set self vs cross comparison",
    GVAnalysis,
)
GENERATION_MANIFEST = Artifact(
    "generation_manifest.json",
    "json",
    "the generate stage's manifest, kept when evaluate runs in the same folder",
    RunManifest,
)

# ---------------------------------------------------------------- RefusalBench: evaluate
RESPONSES = Artifact(
    "responses.parquet", "parquet", "every target reply to the plain prompt: decision, tokens, error", Response
)
JUDGMENTS = Artifact("judgments.parquet", "parquet", "responses with the judge's verdict", Judgment)
CALIBRATION_RESPONSES = Artifact(
    "calibration_responses.parquet",
    "parquet",
    "the calibration pass (evaluation."
    "confidence): every target reply to the confidence-eliciting prompt, with its stated "
    "confidence",
    Response,
)
CALIBRATION_JUDGMENTS = Artifact(
    "calibration_judgments.parquet",
    "parquet",
    "the calibration pass's responses with the judge's verdict: the only source of ECE",
    Judgment,
)
JUDGED = Artifact(
    "judged.parquet",
    "parquet",
    "every row to score (the judged-responses columns ``refusalbench score`` reads) with its "
    "outcome and treatment: outcome ok is scored, the rest (truncated, blocked, failed, ...) are counted",
)
METRICS = Artifact(
    "metrics.json",
    "json",
    "per-model metrics of Appendix D with 95% bootstrap intervals and "
    "standard errors (base items resampled; i.i.d. figures beside them), pairwise model comparisons "
    "(Holm-corrected), response distribution, FRR-MRR correlation",
    MetricsDocument,
)
BREAKDOWN = Artifact(
    "breakdown.parquet", "parquet", "metrics per model x class / intensity / lever / domain / generator, with intervals"
)
CONFUSION = Artifact("confusion.parquet", "parquet", "expected x decided code counts per model")
CALIBRATION = Artifact("calibration.parquet", "parquet", "reliability bins per model (ECE)")
CLASS_INTENSITY = Artifact("class_intensity.parquet", "parquet", "accuracy per model x class x intensity")
REFUSAL_BY_INTENSITY = Artifact("refusal_by_intensity.parquet", "parquet", "refusal rate per model x intensity")
DOMAIN_CHAMPIONS = Artifact("domain_champions.parquet", "parquet", "the best model per domain")
RESPONSE_DISTRIBUTION = Artifact(
    "response_distribution.parquet",
    "parquet",
    "six-way outcome shares per model (correct/wrong answer, correct/wrong-category/"
    "false/missed refusal) with Wilson intervals",
)

# ---------------------------------------------------------------- RefusalBench: refresh rounds
ROUND_TREND = Artifact(
    "round_trend.parquet",
    "parquet",
    "metrics with intervals and standard errors per model and round, with its counts, coverage and whether "
    "that is complete (at least evaluation.min_coverage: only complete rounds are compared)",
)
TREND = Artifact(
    "trend.json",
    "json",
    "rounds compared, significant changes since the previous round (FDR-controlled), "
    "models not compared (incomplete coverage) and differences not tested, incomplete rounds, the round's error bound",
    TrendDocument,
)
FRESHNESS = Artifact(
    "freshness.json",
    "json",
    "items and (base item, lever) pairs seen in earlier rounds, calls "
    "served from earlier rounds' cache entries per role, the cache policy, model fingerprints",
    FreshnessDocument,
)


# ---------------------------------------------------------------- RefusalBench: human audit (paper App. C.2)
AUDIT_SAMPLE = Artifact(
    "audit_sample.parquet",
    "parquet",
    "benchmark items drawn for the human audit, N per class x intensity, in labelling order",
    BenchmarkItem,
)
AUDIT_LABELS = Artifact(
    "labels/audit.jsonl",
    "jsonl",
    "human audit verdicts (PASS/FAIL, failed criteria, note), appended one per line",
    AuditLabel,
)
AUDIT = Artifact(
    "audit.json",
    "json",
    "human audit: pass rate per class / intensity with Wilson intervals, annotator and verifier agreement",
    AuditDocument,
)

# A RefusalBench run folder's files, in the README's order.
ARTIFACTS: tuple[Artifact, ...] = (
    METRICS,
    PRETEST,
    BASE_ITEMS,
    ASSIGNMENTS,
    CANDIDATES,
    VERIFICATIONS,
    FILTER_DECISIONS,
    BENCHMARK,
    GV_ANALYSIS,
    GENERATION_MANIFEST,
    RESPONSES,
    JUDGMENTS,
    CALIBRATION_RESPONSES,
    CALIBRATION_JUDGMENTS,
    JUDGED,
    BREAKDOWN,
    CONFUSION,
    CALIBRATION,
    CLASS_INTENSITY,
    REFUSAL_BY_INTENSITY,
    DOMAIN_CHAMPIONS,
    RESPONSE_DISTRIBUTION,
    ROUND_TREND,
    TREND,
    FRESHNESS,
    AUDIT_SAMPLE,
    AUDIT_LABELS,
    AUDIT,
)
