"""KnowOrNot's files in a run folder, each declared once (its part of the public data contract).

Every file a KnowOrNot run writes is an :class:`~refusalbench.tasks.core.runfolder.Artifact`
here: its name, format, shape (a record of ``records.py`` or a document of ``documents.py``)
and one line saying what it is. Code reads and writes them through these declarations
(``store.save(kon_files.QA_PAIRS, pairs)``), so no file name is spelled out anywhere else.
The files both methods write (manifest, report) are declared in ``tasks/core/runfolder.py``.
"""

from __future__ import annotations

from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.core.runfolder import Artifact
from refusalbench.tasks.knowornot.schema.json_files import (
    AgreementDocument,
    EvalSpecsDocument,
    IndexMeta,
    KnowOrNotMetricsDocument,
    StageFailures,
)
from refusalbench.tasks.knowornot.schema.records import (
    AtomicFact,
    EvalOutcome,
    ExperimentInput,
    ExperimentOutput,
    FilterReport,
    HypotheticalAnswers,
    OOKBQuestion,
    QAPair,
    Sentence,
)

SENTENCES = Artifact(
    "sentences.parquet", "parquet", "NLTK sentences of the documents (those turned into facts)", Sentence, "knowornot"
)
FACTS = Artifact("facts.parquet", "parquet", "atomic facts extracted per sentence", AtomicFact, "knowornot")
QA_PAIRS_ALL = Artifact(
    "qa_pairs_all.parquet", "parquet", "every QA pair before the diversity filters", QAPair, "knowornot"
)
QA_PAIRS = Artifact("qa_pairs.parquet", "parquet", "the diverse QA pairs kept", QAPair, "knowornot")
FILTER_REPORT = Artifact(
    "filter_report.json", "json", "what the TF-IDF and embedding filters removed", FilterReport, "knowornot"
)
KB_INDEX = Artifact("kb.faiss", "bytes", "FAISS inner-product index over the kept pairs", None, "knowornot")
KB_INDEX_META = Artifact("kb.faiss.json", "json", "fingerprint of the indexed knowledge base", IndexMeta, "knowornot")
HYDE_ANSWERS = Artifact(
    "hyde_answers.parquet", "parquet", "hypothetical answers per question (HyDE)", HypotheticalAnswers, "knowornot"
)
OOKB_QUESTIONS = Artifact(
    "ookb_questions.parquet", "parquet", "synthetic out-of-knowledge-base questions", OOKBQuestion, "knowornot"
)
EXPERIMENT_INPUTS = Artifact(
    "experiment_inputs.parquet",
    "parquet",
    "the leave-one-out grid: question x retrieval x prompt x target",
    ExperimentInput,
    "knowornot",
)
EXPERIMENT_OUTPUTS = Artifact(
    "experiment_outputs.parquet", "parquet", "target replies per experiment", ExperimentOutput, "knowornot"
)
EVALUATIONS = Artifact(
    "evaluations.parquet", "parquet", "the evaluator's outcome per experiment x spec", EvalOutcome, "knowornot"
)
RUN_SPECS = Artifact(
    "eval_specs.json",
    "json",
    "the evaluation specs the run applied: built-in and the config's own (the label command finds them here)",
    EvalSpecsDocument,
    "knowornot",
)
STAGE_FAILURES = Artifact(
    "stage_failures.json", "json", "items an LLM stage could not process", StageFailures, "knowornot"
)
RESULTS = Artifact("results.parquet", "parquet", "one row per experiment: inputs, reply, outcomes", None, "knowornot")
KON_METRICS_TABLE = Artifact(
    "metrics.parquet",
    "parquet",
    "abstention and factuality rates per configuration "
    "(leave-one-out questions; synthetic out-of-KB ones apart in metrics.json)",
    None,
    "knowornot",
)
SPEC_RATES = Artifact(
    "spec_rates.parquet",
    "parquet",
    "share of each outcome of each evaluation spec per configuration, with 95% bootstrap intervals",
    None,
    "knowornot",
)
KON_METRICS = Artifact(
    "metrics.json",
    "json",
    "the rates per configuration and per spec outcome, the filter report and the duplicate-overlap audit",
    KnowOrNotMetricsDocument,
    "knowornot",
)
LABEL_SAMPLE = Artifact(
    "label_sample.parquet",
    "parquet",
    "the stratified samples for human labels, one per evaluation spec (label_spec) from the rows it applies to",
    None,
    "knowornot",
)
LABEL_SAMPLE_SPEC = "label_spec"  # the label sample's column naming the spec a row was drawn for
EVALUATOR_COMPARISON = Artifact(
    "evaluator_comparison.parquet",
    "parquet",
    "the outcomes of the knowornot.evaluator_comparison models on the label sample",
    EvalOutcome,
    "knowornot",
)

# A KnowOrNot run folder's files, in the README's order.
ARTIFACTS: tuple[Artifact, ...] = (
    SENTENCES,
    FACTS,
    QA_PAIRS_ALL,
    QA_PAIRS,
    FILTER_REPORT,
    KB_INDEX,
    KB_INDEX_META,
    HYDE_ANSWERS,
    OOKB_QUESTIONS,
    EXPERIMENT_INPUTS,
    EXPERIMENT_OUTPUTS,
    EVALUATIONS,
    RUN_SPECS,
    STAGE_FAILURES,
    RESULTS,
    KON_METRICS_TABLE,
    SPEC_RATES,
    KON_METRICS,
    LABEL_SAMPLE,
    EVALUATOR_COMPARISON,
)


# ---------------------------------------------------------------- families of files


def labels_file(spec: str) -> Artifact:
    """``labels/<spec>.jsonl``: human labels, one JSON line per label, appended as they are given."""
    return Artifact(f"labels/{spec}.jsonl", "jsonl", f"human labels for the {spec} spec", HumanLabel, "knowornot")


def consensus_file(spec: str) -> Artifact:
    """``labels/consensus/<spec>.jsonl``: the label agreed for each item the annotators labelled differently."""
    return Artifact(
        f"labels/consensus/{spec}.jsonl",
        "jsonl",
        f"consensus labels for the {spec} spec's disagreements",
        HumanLabel,
        "knowornot",
    )


def agreement_file(spec: str) -> Artifact:
    """``agreement-<spec>.json``: agreement between the annotators of a spec, and with its evaluator."""
    return Artifact(f"agreement-{spec}.json", "json", f"agreement on the {spec} spec", AgreementDocument, "knowornot")
