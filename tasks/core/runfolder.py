"""The run folder: every artifact a run writes, declared once (the public data contract).

A run folder (local path or ``s3://...``) holds one run's artifacts. Each is declared
here as an :class:`Artifact`: its file name, its format, the type that fixes its shape
(a record class for Parquet rows, a document model for JSON) and one line saying what it
is. Code reads and writes artifacts through these declarations
(``store.save(runfolder.BENCHMARK, items)``, ``store.load(runfolder.BENCHMARK)``), so no
file name is spelled out anywhere else, and the README's table of the run folder is
generated from :data:`ARTIFACTS` (``runfolder_markdown``).

``manifest.json`` carries :data:`SCHEMA_VERSION`. Adding an artifact or a column is a
minor change; renaming or removing one, or changing a column's meaning, is a major one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from refusalbench.tasks.core import documents as doc
from refusalbench.tasks.core import records as rec
from refusalbench.tasks.knowornot import records as kon

SCHEMA_VERSION = "1.2"

Format = Literal["parquet", "json", "html", "bytes", "jsonl"]


@dataclass(frozen=True)
class Artifact:
    name: str
    format: Format
    about: str
    schema: type[BaseModel] | None = None  # None: a table whose columns are listed in ``about``
    method: Literal["refusalbench", "knowornot", "both"] = "refusalbench"

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------- both methods
MANIFEST = Artifact("manifest.json", "json", "provenance: config, hashes, seed, stage timings, counts, calls, status",
                    rec.RunManifest, "both")
REPORT = Artifact("report.html", "html", "self-contained HTML report", None, "both")

# ---------------------------------------------------------------- RefusalBench: generate
PRETEST = Artifact("pretest.parquet", "parquet", "the base-set pre-test: one row per base item x pre-test model "
                   "(answer, judge score, correct, kept)", rec.PretestRow)
BASE_ITEMS = Artifact("base_items.parquet", "parquet", "the base items drawn for this run", rec.BaseItem)
ASSIGNMENTS = Artifact("assignments.parquet", "parquet", "lever assignment: base item x stratum x lever", rec.Assignment)
CANDIDATES = Artifact("candidates.parquet", "parquet", "every generation attempt, failures, raw text and pre-check "
                      "outcome included", rec.Candidate)
VERIFICATIONS = Artifact("verifications.parquet", "parquet", "one row per pre-checked candidate x verifier: verdict "
                         "(effective and stated), consistency, criteria, raw", rec.Verification)
FILTER_DECISIONS = Artifact("filter_decisions.json", "json", "the consensus filter's decision per candidate",
                            doc.FilterDecisions)
BENCHMARK = Artifact("benchmark.parquet", "parquet", "the accepted, stratified benchmark items", rec.BenchmarkItem)
GV_ANALYSIS = Artifact("gv_analysis.json", "json", "generator x verifier pass rates, self-evaluation bias, kappa, "
                       "verdict consistency, pre-check rejections, funnel",
                       doc.GVAnalysis)
GENERATION_MANIFEST = Artifact("generation_manifest.json", "json",
                               "the generate stage's manifest, kept when evaluate runs in the same folder",
                               rec.RunManifest)

# ---------------------------------------------------------------- RefusalBench: evaluate
RESPONSES = Artifact("responses.parquet", "parquet", "every target reply: decision, confidence, tokens, error",
                     rec.Response)
JUDGMENTS = Artifact("judgments.parquet", "parquet", "responses with the judge's verdict", rec.Judgment)
JUDGED = Artifact("judged.parquet", "parquet", "the scorable rows (DESIGN.md §6 judged-responses columns)")
METRICS = Artifact("metrics.json", "json", "per-model metrics of Appendix D with 95% bootstrap intervals and "
                   "standard errors, response distribution, FRR-MRR correlation", doc.MetricsDocument)
BREAKDOWN = Artifact("breakdown.parquet", "parquet", "metrics per model x class / intensity / lever / domain / generator, "
                     "with intervals")
CONFUSION = Artifact("confusion.parquet", "parquet", "expected x decided code counts per model")
CALIBRATION = Artifact("calibration.parquet", "parquet", "reliability bins per model (ECE)")
CLASS_INTENSITY = Artifact("class_intensity.parquet", "parquet", "accuracy per model x class x intensity")
REFUSAL_BY_INTENSITY = Artifact("refusal_by_intensity.parquet", "parquet", "refusal rate per model x intensity")
DOMAIN_CHAMPIONS = Artifact("domain_champions.parquet", "parquet", "the best model per domain")
RESPONSE_DISTRIBUTION = Artifact("response_distribution.parquet", "parquet",
                                 "six-way outcome shares per model (correct/wrong answer, correct/wrong-category/"
                                 "false/missed refusal) with Wilson intervals")

# ---------------------------------------------------------------- RefusalBench: refresh rounds
ROUND_TREND = Artifact("round_trend.parquet", "parquet", "metrics with intervals per model and round")
TREND = Artifact("trend.json", "json", "rounds compared and models that moved beyond their interval",
                 doc.TrendDocument)

# ---------------------------------------------------------------- RefusalBench: human audit (paper App. C.2)
AUDIT_SAMPLE = Artifact("audit_sample.parquet", "parquet",
                        "benchmark items drawn for the human audit, N per class x intensity, in labelling order",
                        rec.BenchmarkItem)
AUDIT_LABELS = Artifact("labels/audit.jsonl", "jsonl", "human audit verdicts (PASS/FAIL, failed criteria, note), "
                        "appended one per line", doc.AuditLabel)
AUDIT = Artifact("audit.json", "json", "human audit: pass rate per class / intensity with Wilson intervals, "
                 "annotator and verifier agreement", doc.AuditDocument)

# ---------------------------------------------------------------- KnowOrNot
SENTENCES = Artifact("sentences.parquet", "parquet", "NLTK sentences of the documents (those turned into facts)", kon.Sentence,
                     "knowornot")
FACTS = Artifact("facts.parquet", "parquet", "atomic facts extracted per sentence", kon.AtomicFact, "knowornot")
QA_PAIRS_ALL = Artifact("qa_pairs_all.parquet", "parquet", "every QA pair before the diversity filters", kon.QAPair,
                        "knowornot")
QA_PAIRS = Artifact("qa_pairs.parquet", "parquet", "the diverse QA pairs kept", kon.QAPair, "knowornot")
FILTER_REPORT = Artifact("filter_report.json", "json", "what the TF-IDF and embedding filters removed",
                         kon.FilterReport, "knowornot")
KB_INDEX = Artifact("kb.faiss", "bytes", "FAISS inner-product index over the kept pairs", None, "knowornot")
KB_INDEX_META = Artifact("kb.faiss.json", "json", "fingerprint of the indexed knowledge base", doc.IndexMeta, "knowornot")
HYDE_ANSWERS = Artifact("hyde_answers.parquet", "parquet", "hypothetical answers per question (HyDE)",
                        kon.HypotheticalAnswers, "knowornot")
OOKB_QUESTIONS = Artifact("ookb_questions.parquet", "parquet", "synthetic out-of-knowledge-base questions",
                          kon.OOKBQuestion, "knowornot")
EXPERIMENT_INPUTS = Artifact("experiment_inputs.parquet", "parquet",
                             "the leave-one-out grid: question x retrieval x prompt x target", kon.ExperimentInput,
                             "knowornot")
EXPERIMENT_OUTPUTS = Artifact("experiment_outputs.parquet", "parquet", "target replies per experiment",
                              kon.ExperimentOutput, "knowornot")
EVALUATIONS = Artifact("evaluations.parquet", "parquet", "the evaluator's outcome per experiment x spec",
                       kon.EvalOutcome, "knowornot")
RUN_SPECS = Artifact("eval_specs.json", "json", "the evaluation specs the run applied: built-in and the config's own "
                     "(the label command finds them here)", doc.EvalSpecsDocument, "knowornot")
STAGE_FAILURES = Artifact("stage_failures.json", "json", "items an LLM stage could not process",
                          doc.StageFailures, "knowornot")
RESULTS = Artifact("results.parquet", "parquet", "one row per experiment: inputs, reply, outcomes", None, "knowornot")
KON_METRICS_TABLE = Artifact("metrics.parquet", "parquet", "abstention and factuality rates per configuration",
                             None, "knowornot")
SPEC_RATES = Artifact("spec_rates.parquet", "parquet", "share of each outcome of each evaluation spec per "
                     "configuration, with 95% bootstrap intervals", None, "knowornot")
KON_METRICS = Artifact("metrics.json", "json", "the rates per configuration and per spec outcome, the filter report "
                       "and the duplicate-overlap audit", doc.KnowOrNotMetricsDocument, "knowornot")
LABEL_SAMPLE = Artifact("label_sample.parquet", "parquet", "the stratified sample for human labels", None, "knowornot")

# Both methods write a ``metrics.json`` (each run folder holds one method's run).
ARTIFACTS: tuple[Artifact, ...] = (
    MANIFEST, REPORT, METRICS, PRETEST, BASE_ITEMS, ASSIGNMENTS, CANDIDATES, VERIFICATIONS, FILTER_DECISIONS, BENCHMARK, GV_ANALYSIS,
    GENERATION_MANIFEST, RESPONSES, JUDGMENTS, JUDGED, BREAKDOWN, CONFUSION, CALIBRATION, CLASS_INTENSITY,
    REFUSAL_BY_INTENSITY, DOMAIN_CHAMPIONS, RESPONSE_DISTRIBUTION, ROUND_TREND, TREND,
    AUDIT_SAMPLE, AUDIT_LABELS, AUDIT, SENTENCES, FACTS, QA_PAIRS_ALL, QA_PAIRS,
    FILTER_REPORT, KB_INDEX, KB_INDEX_META, HYDE_ANSWERS, OOKB_QUESTIONS, EXPERIMENT_INPUTS, EXPERIMENT_OUTPUTS,
    EVALUATIONS, RUN_SPECS, STAGE_FAILURES, RESULTS, KON_METRICS_TABLE, SPEC_RATES, KON_METRICS, LABEL_SAMPLE,
)


# ---------------------------------------------------------------- families of files

def labels_file(spec: str) -> Artifact:
    """``labels/<spec>.jsonl``: human labels, one JSON line per label, appended as they are given."""
    return Artifact(f"labels/{spec}.jsonl", "jsonl", f"human labels for the {spec} spec", kon.HumanLabel, "knowornot")


def agreement_file(spec: str) -> Artifact:
    return Artifact(f"agreement-{spec}.json", "json", f"agreement on the {spec} spec", doc.AgreementDocument,
                    "knowornot")


WORK = "_work"  # intermediate shards of the stage tasks (safe to delete after a run)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def input_shard(kind: str, index: int) -> str:
    """``_work/<kind>-0007.parquet``: the 8th input shard of a stage."""
    return f"{WORK}/{kind}-{index:04d}.parquet"


def output_shard(kind: str, model: str, index: int) -> str:
    """``_work/<kind>/<model>-0007.parquet``: one model's output for input shard 7."""
    return f"{WORK}/{kind}/{_safe(model)}-{index:04d}.parquet"


def shard_index(name: str) -> int:
    """'_work/items-0007.parquet' -> 7."""
    return int(name.rsplit("-", 1)[-1].split(".")[0])


def runfolder_markdown() -> str:
    """The README's run-folder table, generated from the declarations."""
    lines = ["| file | method | format | shape | what it is |", "|---|---|---|---|---|"]
    for artifact in ARTIFACTS:
        shape = artifact.schema.__name__ if artifact.schema is not None else {"parquet": "table"}.get(artifact.format, "-")
        lines.append(f"| `{artifact.name}` | {artifact.method} | {artifact.format} | {shape} | {artifact.about} |")
    lines.append("| `labels/<spec>.jsonl` | knowornot | jsonl | HumanLabel | human labels, appended one per line |")
    lines.append("| `agreement-<spec>.json` | knowornot | json | AgreementDocument | agreement between annotators and "
                 "with the evaluator |")
    lines.append("| `kb/<name>/...` | knowornot | (as above) | - | a multi-base run (`knowornot.knowledge_bases`): each "
                 "base's own sentences, facts, QA pairs, filter report and FAISS index; the run folder's files merge "
                 "them, ids prefixed `<name>/` |")
    lines.append(f"| `{WORK}/...` | both | parquet | (records) | stage-task shards; safe to delete after a run |")
    return "\n".join(lines)
