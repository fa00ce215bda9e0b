"""Base sets: the items perturbations start from.

``loading`` reads and validates a base set (JSONL, Parquet or CSV), reporting every problem as
``FILE:LINE: field: problem``; ``kilt_nq`` and ``garage`` build base sets from NaturalQuestions
(via KILT) and GaRAGe with the paper's curation (App. C.1). The modules below them hold the
format's fields and problem collection (``problems``), the per-format readers (``readers``), the
record checks (``validation``), the importers' shared sampling (``curation``) and their one-pass
reading of large source files with a progress callback (``streaming``).
"""

from refusalbench.tasks.refusalbench.basesets.garage import (
    DEFAULT_GARAGE_COMPLEXITY,
    DEFAULT_GARAGE_TYPES,
    GARAGE_CONTEXT_SIZE,
    GARAGE_MAX_SIGNAL,
    PAPER_GARAGE_DOMAINS,
    import_garage,
)
from refusalbench.tasks.refusalbench.basesets.kilt_nq import import_kilt_nq
from refusalbench.tasks.refusalbench.basesets.loading import (
    base_set_import_hint,
    load_base_set,
    load_configured_base_set,
    validate_base_set,
    write_base_set,
)
from refusalbench.tasks.refusalbench.basesets.problems import (
    BASE_FIELDS,
    MAX_LINE_BYTES,
    MAX_PROBLEMS,
    PASSAGE_FIELDS,
    REQUIRED_FIELDS,
)
from refusalbench.tasks.refusalbench.basesets.readers import CSV_SUFFIXES, JSONL_SUFFIXES, PARQUET_SUFFIXES
from refusalbench.tasks.refusalbench.basesets.streaming import ProgressCallback

__all__ = [
    "BASE_FIELDS",
    "CSV_SUFFIXES",
    "DEFAULT_GARAGE_COMPLEXITY",
    "DEFAULT_GARAGE_TYPES",
    "GARAGE_CONTEXT_SIZE",
    "GARAGE_MAX_SIGNAL",
    "JSONL_SUFFIXES",
    "MAX_LINE_BYTES",
    "MAX_PROBLEMS",
    "PAPER_GARAGE_DOMAINS",
    "PARQUET_SUFFIXES",
    "PASSAGE_FIELDS",
    "ProgressCallback",
    "REQUIRED_FIELDS",
    "import_garage",
    "import_kilt_nq",
    "base_set_import_hint",
    "load_base_set",
    "load_configured_base_set",
    "validate_base_set",
    "write_base_set",
]
