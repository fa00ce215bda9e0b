"""How many base items support each figure of the report, and the small-sample guardrail.

Every interval, standard error and significance test of the scoring resamples base items
(``scoring.clusters``): K base items behind a number means the bootstrap has K units to draw.
Below ``core.stats.MIN_CLUSTERS`` of them the page shows the number and "insufficient data
(n = K)" in place of its interval, standard error, p-value or mark; metrics.json and the
Parquet tables keep every figure.

Which rows support a metric follows its declaration (``scoring.specs``):

- a ratio: the model's rows its denominator counts (the scored rows with an answerable item
  for answer accuracy, every row for a coverage rate);
- a formula of other metrics (CRS of answer and refusal accuracy): the fewest of its inputs';
- a formula of the statistics themselves (ECE): the model's scored rows.

The rows are the judged rows with each item's base item from the benchmark. Without them (a
report made from scores alone) each scored row counts as one unit, as the bootstrap treats a
row without a base item: then K is the rows of metrics.json, the breakdown and the pairwise block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.html_page import escape, insufficient_data, is_nan
from refusalbench.tasks.core.stats import MIN_CLUSTERS, enough_clusters
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_codes
from refusalbench.tasks.refusalbench.scoring.inputs import CLUSTER_COLUMN, ensure_prepared
from refusalbench.tasks.refusalbench.scoring.row_statistics import ALL_STATISTICS, COUNTS, STATISTICS, row_arrays
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS

SCORED = "n"  # the support of a model's scored rows as a whole (its n)
GUARDRAIL_NOTE = (
    f"Where fewer than {MIN_CLUSTERS} base items support a number, its interval, standard error and "
    "significance are not shown: the cell says “insufficient data (n = K)”, K the base items (a bootstrap "
    "over so few units gives intervals that are too narrow and differences that look significant)."
)


class ClusterSupport:
    """Base items behind each model's metrics, breakdown rows and pairs of models."""

    def __init__(
        self,
        judged: pd.DataFrame | None = None,
        benchmark: pd.DataFrame | None = None,
        metrics: Mapping[str, Mapping[str, Any]] | None = None,
        breakdown: pd.DataFrame | None = None,
        pairwise: Mapping[str, Any] | None = None,
    ) -> None:
        self._metrics = metrics or {}
        self._breakdown = breakdown
        self._pairs = {
            frozenset((c["model_a"], c["model_b"])): int(c.get("n_items", 0))
            for c in (pairwise or {}).get("comparisons") or []
        }
        self._sets: dict[str, dict[str, frozenset[int]]] = {}
        self._groups: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        self._breakdown_rows: dict[tuple[str, str, str, str], int] | None = None
        self._rows = self._prepared(judged, benchmark)

    @staticmethod
    def _prepared(judged: pd.DataFrame | None, benchmark: pd.DataFrame | None) -> dict[str, Any] | None:
        if judged is None or judged.empty or "model" not in judged.columns:
            return None
        frame = judged
        if CLUSTER_COLUMN not in frame.columns and benchmark is not None and CLUSTER_COLUMN in benchmark.columns:
            bases = dict(zip(benchmark["item_id"].astype(str), benchmark[CLUSTER_COLUMN]))
            frame = frame.assign(**{CLUSTER_COLUMN: frame["item_id"].astype(str).map(bases)})
        prepared = ensure_prepared(frame)
        codes, _ = cluster_codes(prepared)
        return {"frame": prepared, "codes": codes, "rows": row_arrays(prepared)}

    @property
    def from_base_items(self) -> bool:
        """Counted from the judged rows' base items (else: rows, each its own unit)."""
        return self._rows is not None

    def total(self) -> int | None:
        """Base items among all judged rows (None without judged rows)."""
        return None if self._rows is None else len(np.unique(self._rows["codes"]))

    def _mask(self, metric: str) -> np.ndarray | None:
        """The rows behind a ratio metric or a formula of the statistics; None for a formula of metrics."""
        assert self._rows is not None
        rows = self._rows["rows"]
        scored = rows["scored"]
        spec = METRIC_SPECS.get(metric)
        if metric == SCORED or spec is None or (not spec.is_ratio and not spec.of):
            return np.asarray(scored, dtype=bool)
        if not spec.is_ratio:
            return None
        mask = np.zeros(len(scored), dtype=bool)
        for name in spec.denominator:
            counted = np.asarray(ALL_STATISTICS[name](rows), dtype=bool)
            mask |= counted & scored if name in STATISTICS else counted
        return mask

    def _model_sets(self, metric: str) -> dict[str, frozenset[int]]:
        """model -> the base items behind ``metric`` (cached per metric)."""
        if metric in self._sets:
            return self._sets[metric]
        assert self._rows is not None
        spec = METRIC_SPECS.get(metric)
        mask = self._mask(metric)
        if mask is None and spec is not None:
            inputs = [self._model_sets(name) for name in spec.of]
            models = set().union(*inputs) if inputs else set()
            # The input with the fewest base items bounds the formula's support.
            out = {m: min((s.get(m, frozenset()) for s in inputs), key=len) for m in models}
        else:
            frame = self._rows["frame"]
            models = frame["model"].astype(str).to_numpy()[mask]
            codes = self._rows["codes"][mask]
            out = {m: frozenset(codes[models == m].tolist()) for m in np.unique(models)}
        self._sets[metric] = out
        return out

    def model(self, model: str, metric: str = SCORED) -> int:
        """Base items behind ``model``'s ``metric``."""
        if self._rows is None:
            return self._rows_of(model, metric)
        return len(self._model_sets(metric).get(model, frozenset()))

    def _rows_of(self, model: str, metric: str) -> int:
        """Without judged rows: the rows metrics.json counts for ``metric`` (each row its own unit)."""
        values = self._metrics.get(model, {})
        spec = METRIC_SPECS.get(metric)
        if spec is not None and not spec.is_ratio and spec.of:
            return min(self._rows_of(model, name) for name in spec.of)
        if spec is not None and spec.is_ratio and all(name in COUNTS for name in spec.denominator):
            return sum(_count(values.get(name)) for name in spec.denominator)
        return _count(values.get(SCORED))

    def pair(self, a: str, b: str, metric: str) -> int:
        """Base items behind the paired difference of ``a`` and ``b`` in ``metric``: those both have."""
        if self._rows is None:
            return self._pairs.get(frozenset((a, b)), 0)
        sets = self._model_sets(metric)
        spec = METRIC_SPECS.get(metric)
        if spec is not None and not spec.is_ratio and spec.of:
            return min(self.pair(a, b, name) for name in spec.of)
        return len(sets.get(a, frozenset()) & sets.get(b, frozenset()))

    def group(self, model: str, dimension: str, value: str, metric: str) -> int:
        """Base items behind ``model``'s ``metric`` among its rows whose ``dimension`` is ``value``."""
        if self._rows is None:
            return self._breakdown_n(model, dimension, value, metric)
        key = (dimension, metric)
        if key not in self._groups:
            frame = self._rows["frame"]
            mask = self._mask(metric)
            if dimension not in frame.columns or mask is None:
                self._groups[key] = {}
            else:
                part = pd.DataFrame(
                    {
                        "model": frame["model"].astype(str).to_numpy()[mask],
                        "value": frame[dimension].astype(str).to_numpy()[mask],
                        "code": self._rows["codes"][mask],
                    }
                )
                counts = part.groupby(["model", "value"], sort=False)["code"].nunique()
                self._groups[key] = {k: int(v) for k, v in counts.items()}
        return self._groups[key].get((model, str(value)), 0)

    def _breakdown_n(self, model: str, dimension: str, value: str, metric: str) -> int:
        """Without judged rows: the breakdown row's n (0 where the table has none)."""
        if self._breakdown_rows is None:
            table = self._breakdown
            columns = ("model", "group", "value", "metric", "n")
            if table is None or table.empty or any(c not in table.columns for c in columns):
                self._breakdown_rows = {}
            else:
                self._breakdown_rows = {
                    (str(m), str(g), str(v), str(k)): _count(n)
                    for m, g, v, k, n in zip(*(table[c].tolist() for c in columns))
                }
        return self._breakdown_rows.get((model, dimension, str(value), metric), 0)


def _count(value: Any) -> int:
    return 0 if value is None or is_nan(value) else int(value)


def guarded(text: str, n_clusters: int) -> str:
    """``text`` (an interval, a standard error: plain text) escaped, or the guardrail's note."""
    return escape(text) if enough_clusters(n_clusters) else insufficient_data(n_clusters)


def guarded_ci(text: str, n_clusters: int) -> str:
    """The ``<br>``-separated grey line under a value: the interval ``text`` or the guardrail's note;
    '' when there is no interval to show."""
    if not text:
        return ""
    return f"<br><span class='ci'>{guarded(text, n_clusters)}</span>"


def line_points(frame: pd.DataFrame, n_column: str = "n") -> pd.DataFrame:
    """``frame`` with ``joined``: whether its point may be joined to its neighbours by a line (its
    ``n_column`` reaches :data:`~refusalbench.tasks.core.stats.MIN_CLUSTERS`). A figure draws a
    point that is not joined as a lone marker."""
    counts = pd.to_numeric(frame[n_column], errors="coerce") if n_column in frame.columns else None
    joined = [False] * len(frame) if counts is None else [enough_clusters(c) for c in counts]
    return frame.assign(joined=joined)


def guarded_trend(readable: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The trend table a person reads (``rounds.trend.readable_trend``) with each point's interval
    replaced by the guardrail's words where its ``n`` is below the minimum, and whether the point
    is joined to the others by a line."""
    out = []
    for row in readable:
        shown = dict(row)
        n = row.get("n")
        enough = n is not None and enough_clusters(n)
        if not enough:
            for label in labels:
                text = str(shown.get(label, ""))
                if " [" in text:
                    shown[label] = f"{text.split(' [')[0]} (insufficient data (n = {n if n is not None else 0}))"
        shown["line"] = "joined" if enough else "point only"
        out.append(shown)
    return out


def floor_warning(n_clusters: int) -> str:
    """A warning for the summary when too few base items were evaluated for any interval; else ''."""
    if enough_clusters(n_clusters):
        return ""
    return (
        f"Only {n_clusters} base item(s) evaluated: below {MIN_CLUSTERS}, the page shows no interval, "
        "standard error or significance."
    )
