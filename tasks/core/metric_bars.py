"""Bars a finished run's metrics must clear: ``--fail-under METRIC=VALUE``, parsed and checked.

Each method says which metrics a bar may name and which way is better (RefusalBench: its metric
registry; KnowOrNot: its rates). A bar is failed when a target's value is *worse* than it: below
it for a metric where higher is better (or that has no better direction), above it for one where
lower is better (a false or missed refusal rate). An undefined value (no rows to compute it on)
fails too: a gate cannot say it was met. Values are on metrics.json's scale, fractions from 0 to
1; ``70%`` is accepted as 0.7. A bar that cannot be read is bad input (exit 2), raised before the
run starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from refusalbench.tasks.core.errors import InputError, closest_names

OPTION = "--fail-under"


@dataclasses.dataclass(frozen=True)
class MetricBar:
    """One ``METRIC=VALUE``: the metric's name as metrics.json spells it, the bar, and its direction."""

    metric: str
    value: float
    lower_is_better: bool = False

    def failed_by(self, value: float | None) -> bool:
        """Whether ``value`` is worse than the bar (an undefined value is)."""
        if value is None or math.isnan(value):
            return True
        return value > self.value if self.lower_is_better else value < self.value

    @property
    def wording(self) -> str:
        return "above the bar" if self.lower_is_better else "below the bar"


@dataclasses.dataclass(frozen=True)
class BarFailure:
    """A target whose metric is worse than a bar."""

    target: str
    bar: MetricBar
    value: float | None

    def line(self) -> str:
        shown = "undefined" if self.value is None or math.isnan(self.value) else f"{self.value:.4g}"
        return f"fail: {self.target}: {self.bar.metric} = {shown}, {self.bar.wording} {self.bar.value:g}"


def _problem(text: str, message: str) -> InputError:
    return InputError("command line", f"{text!r}: {message}", field=OPTION)


def _value(text: str, raw: str, percent: bool) -> float:
    raw = raw.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise _problem(text, f"{raw!r} is not a number (write METRIC=0.7 or METRIC=70%)") from None
    if math.isnan(value) or math.isinf(value):
        raise _problem(text, "the bar must be a finite number")
    if percent and not 0.0 <= value <= 1.0:
        raise _problem(text, "metrics.json holds shares from 0 to 1: write 0.7 or 70%, not 70")
    return value


def parse_bars(
    texts: Iterable[str],
    known: Mapping[str, bool | None],
    aliases: Mapping[str, str] | None = None,
    shares: Iterable[str] = (),
) -> list[MetricBar]:
    """The bars of ``texts`` (``METRIC=VALUE`` each), or an InputError naming the first bad one.

    ``known``: {metric name: higher is better (True), lower is better (False), neither (None)};
    ``aliases``: other names accepted for a metric ({alias: name}); ``shares``: metrics whose
    values lie between 0 and 1 (a bar outside that range is a mistake, e.g. 70 for 70%).
    An unknown name is answered with the closest known one and the whole list.
    """
    aliases = dict(aliases or {})
    share_names = set(shares)
    bars = []
    for text in texts:
        name, equals, raw = text.partition("=")
        name = name.strip().lower()
        if not equals or not name or not raw.strip():
            raise _problem(text, "expected METRIC=VALUE, e.g. crs=0.7")
        metric = aliases.get(name, name)
        if metric not in known:
            choices = sorted({*known, *aliases})
            close = closest_names(name, choices, 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _problem(text, f"unknown metric {name!r}{hint}; known: {', '.join(choices)}")
        bars.append(MetricBar(metric, _value(text, raw, metric in share_names), lower_is_better=known[metric] is False))
    return bars


def check_bars(values: Mapping[str, Mapping[str, float | None]], bars: Iterable[MetricBar]) -> list[BarFailure]:
    """Every (target, bar) where the target's value is worse than the bar, in target order then bar order.

    ``values``: {target: {metric: value}}; a metric a target lacks counts as undefined.
    """
    bars = list(bars)
    return [
        BarFailure(target, bar, metrics.get(bar.metric))
        for target, metrics in values.items()
        for bar in bars
        if bar.failed_by(metrics.get(bar.metric))
    ]
