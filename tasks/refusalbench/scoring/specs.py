"""What a metric is: :class:`MetricSpec`, the one registry of metrics and the queries over it.

Each metric of metrics.json is one :class:`MetricSpec` in :data:`METRIC_SPECS`, declared once
with :func:`declare` (or :func:`formula_metric`): its name, its labels, how it is computed and
how it is shown. The paper's metrics are declared in :mod:`.paper_metrics`; a plugin declares
its own the same way. Everything else derives from the declarations: the scoring arrays, the
bootstrap and breakdown intervals (:mod:`.bootstrap`, :mod:`.intervals`), the leaderboard's
columns (``report.leaderboard``), the model-comparison figures and the inspect task's metrics.
Adding a ratio metric is one declaration::

    declare(MetricSpec("unjudged_rate", label="Unjudged", numerator=("n_unjudged",),
                       denominator=("n_answerable",), higher_is_better=False))

A *ratio* metric is a count over a count of :mod:`.row_statistics`, which lets the breakdowns
give it Wilson intervals; the rest are a *formula* of metrics declared before them (F1, the
hierarchical score, CRS) or of the statistics themselves (ECE). Undefined ratios are NaN,
never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.refusalbench.scoring.row_statistics import ALL_STATISTICS, ratio, stat_sum


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric of metrics.json, declared once: how it is computed and how it is shown.

    A ratio gives ``numerator`` and ``denominator`` (statistics of :data:`STATISTICS`, each
    side summed); anything else gives a ``formula`` of the metrics named in ``of`` (declared
    before it), or of the statistics array itself when ``of`` is empty.
    """

    name: str
    label: str  # the leaderboard's column header: short
    title: str = ""  # in words, for figure titles and tables (default: the label)
    numerator: tuple[str, ...] = ()
    denominator: tuple[str, ...] = ()
    formula: Callable[..., np.ndarray] | None = None
    of: tuple[str, ...] = ()
    higher_is_better: bool | None = True  # None: neither (a rate that describes behaviour)
    leaderboard: bool = False  # a column of the leaderboard
    compared: bool = False  # drawn in the model-comparison figures (scaling, SFT vs DPO, thinking budget)
    inspect_task: bool = False  # one of the inspect task's metrics
    multi_document: bool = False  # GaRAGe's: scored only on runs with multi-document rows (NaN elsewhere)
    # Describes which rows could be scored (coverage, non-response rates), not the behaviour scored:
    # in metrics.json beside the others, without bootstrap intervals or breakdown rows.
    coverage: bool = False
    percent: bool = True  # shown as a percentage; else as a number with three decimals (ECE)
    # Read from stated confidences: computed from the calibration pass's rows when a run has one
    # (``scoring.calibration``), from the scored rows' own confidences otherwise.
    calibration: bool = False
    # Other names a user may give for it (``--fail-under crs=0.6``), lowercase, unique across metrics.
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.label)
        if self.formula is None and not (self.numerator and self.denominator):
            raise ValueError(f"metric {self.name!r}: give a numerator and a denominator, or a formula")
        if self.formula is not None and (self.numerator or self.denominator):
            raise ValueError(f"metric {self.name!r}: a ratio or a formula, not both")
        if self.of and self.formula is None:
            raise ValueError(f"metric {self.name!r}: 'of' names the inputs of a formula")
        unknown = [s for s in self.numerator + self.denominator if s not in ALL_STATISTICS]
        if unknown:
            raise ValueError(
                f"metric {self.name!r}: unknown statistic {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(ALL_STATISTICS)})"
            )

    @property
    def is_ratio(self) -> bool:
        """A count over a count (its breakdown intervals are Wilson's)."""
        return self.formula is None

    def values(self, stats: np.ndarray, earlier: Mapping[str, np.ndarray]) -> np.ndarray:
        """The metric from (..., N_STATS) statistics; ``earlier``: the metrics declared before it."""
        if self.formula is None:
            return ratio(stat_sum(stats, self.numerator), stat_sum(stats, self.denominator))
        if not self.of:
            return self.formula(stats)
        return self.formula(*(earlier[name] for name in self.of))


METRIC_SPECS: Registry[MetricSpec] = Registry("metric")

F = TypeVar("F", bound=Callable[..., np.ndarray])


def declare(spec: MetricSpec, *, replace: bool = False) -> MetricSpec:
    """Register ``spec`` under its name; a formula's inputs must be declared before it."""
    declared = list(METRIC_SPECS)
    before = declared[: declared.index(spec.name)] if spec.name in declared else declared
    missing = [name for name in spec.of if name not in before]
    if missing:
        raise ValueError(
            f"metric {spec.name!r} is a function of {', '.join(map(repr, missing))}, which must be declared before it"
        )
    return METRIC_SPECS.add(spec.name, spec, replace=replace)


def formula_metric(name: str, *, replace: bool = False, **fields: Any) -> Callable[[F], F]:
    """Decorator: declare the decorated function as the formula of metric ``name``.

    ``fields`` are the other :class:`MetricSpec` fields (``label``, ``of``, ...).
    """

    def decorate(formula: F) -> F:
        declare(MetricSpec(name, formula=formula, **fields), replace=replace)
        return formula

    return decorate


def metric_spec(name: str) -> MetricSpec:
    """The declaration of metric ``name`` (ValueError listing the declared ones if none)."""
    return METRIC_SPECS.lookup(name)


def metric_aliases() -> dict[str, str]:
    """{alias: metric name} of every declared metric's other names (``crs`` -> ``calibrated_refusal_score``)."""
    return {alias: name for name, spec in METRIC_SPECS.items() for alias in spec.aliases}


def single_document_metrics() -> tuple[str, ...]:
    """The metrics every run is scored on (§6's), in declaration order."""
    return tuple(name for name, spec in METRIC_SPECS.items() if not spec.multi_document and not spec.coverage)


def coverage_metrics() -> tuple[str, ...]:
    """The rates of what became of the rows (scored share, truncated, blocked, ...), in declaration order."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.coverage)


def multi_document_metrics() -> tuple[str, ...]:
    """GaRAGe's metrics (App. D, F.9): they need a multi-document judge, NaN on single-document rows."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.multi_document)


def calibration_metrics() -> tuple[str, ...]:
    """The metrics of stated confidences (ECE): a run's calibration pass feeds them when it has one."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.calibration)


def all_metrics() -> tuple[str, ...]:
    """Every declared metric, in metrics.json's order: the single-document ones, then GaRAGe's."""
    return single_document_metrics() + multi_document_metrics()
