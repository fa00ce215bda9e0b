"""The run's budget (``budget_usd`` in the config), checked before each shard is sent.

- Spent so far: the run's priced calls (``runtime.CallCounter``), from the start of ``run`` (its
  generation and evaluation share one budget: :func:`budget_span`), of each refresh round, or of
  a ``generate`` / ``evaluate`` run on its own. Calls served from a cache cost nothing.
- The next shard: ``plan``'s per-call ceiling (the model's prompts rendered as ``plan`` renders
  them, at most ``max_tokens`` out, the config's price over LiteLLM's map; calls a model sends
  through the batch API at the batch price) times the shard's rows, for the model the shard is for
  and the stage's models no shard is for (the judge of a target's answers). Shards sent and not
  done count at that estimate until they are; a batch-mode model's one shard of a stage (its
  whole batch job) is checked as one.
- When the next shard would take the spend past the budget, nothing more is sent: the shards on
  their way finish (their calls go into the call cache, their results into Prefect's task cache),
  the manifest records the calls and costs so far, and the run stops with :class:`BudgetExceeded`
  (exit 1, one line naming spend, budget and stage). A re-run with a larger budget finds what was
  done in the caches and sends only the rest.
- A model without a price cannot be bounded: its calls count as $0 here, and a note says so.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import BudgetExceeded
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.pipeline.runtime import CallCounter
from refusalbench.tasks.pipeline.ui import SpendDisplay, story

EVALUATION_STAGES = ("respond", "judge", "calibrate")
# ``plan`` counts the calibration pass inside respond and judge: a calibrate shard costs what theirs do.
PLAN_STAGES = {"calibrate": ("respond", "judge")}
# The counter of the span a budget covers (``run``: generation and evaluation), when one is open.
_span: ContextVar[CallCounter | None] = ContextVar("refusalbench_budget_span", default=None)


@contextmanager
def budget_span(cfg: RunConfig) -> Iterator[None]:
    """One budget for the flows run inside (``run``: generate, then evaluate); no-op without ``budget_usd``."""
    if cfg.budget_usd is None or _span.get() is not None:
        yield
        return
    token = _span.set(CallCounter(cfg))
    try:
        yield
    finally:
        _span.reset(token)


def per_call_costs(plan: Any) -> dict[str, dict[str, float | None]]:
    """{stage: {model: USD per call}} of a ``refusalbench.plan.Plan``: each model's ceiling over its calls,
    as configured (a batch-mode model's calls at the batch price; a model whose respond and calibrate
    differ in mode: their average)."""
    return {
        name: {model: None if m.cost_usd is None else m.cost_usd / max(m.calls, 1) for model, m in stage.models.items()}
        for name, stage in plan.stages.items()
    }


@dataclass
class Budget:
    """The budget of one run, as its fan-out checks it shard by shard."""

    cfg: RunConfig
    recorder: ManifestRecorder
    limit_usd: float
    counter: CallCounter = field(init=False)  # this run's calls, for its manifest
    spend: CallCounter = field(init=False)  # the calls the budget covers: ``run``'s both flows
    _reserved: dict[int, float] = field(default_factory=dict, init=False)
    _futures: list[Any] = field(default_factory=list, init=False)
    _costs: dict[bool, dict[str, dict[str, float | None]]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _display: SpendDisplay = field(default_factory=SpendDisplay, init=False)

    def __post_init__(self) -> None:
        self.counter = CallCounter(self.cfg)
        self.spend = _span.get() or self.counter

    @classmethod
    def of(cls, cfg: RunConfig, recorder: ManifestRecorder) -> Budget | None:
        return cls(cfg, recorder, cfg.budget_usd) if cfg.budget_usd is not None else None

    # ------------------------------------------------------------ the estimate

    def per_call(self, stage: str) -> dict[str, float | None]:
        """Each model's expected cost per call in ``stage`` (``plan``: once per run for the generation
        stages, once for the evaluation stages, on the benchmark this run evaluates when it is placed)."""
        evaluating = stage in EVALUATION_STAGES
        if evaluating not in self._costs:
            self._costs[evaluating] = costs = self._plan_costs(evaluating)
            unpriced = sorted({m for models in costs.values() for m, c in models.items() if c is None})
            if unpriced:
                self.recorder.note(
                    f"budget_usd cannot bound {', '.join(unpriced)}: no price (or no max_tokens) "
                    "to estimate their calls, which count as $0 against the budget"
                )
        costs = self._costs[evaluating]
        return {model: cost for name in PLAN_STAGES.get(stage, (stage,)) for model, cost in costs.get(name, {}).items()}

    def _plan_costs(self, evaluating: bool) -> dict[str, dict[str, float | None]]:
        from refusalbench.tasks.refusalbench.plan.estimate import plan_run
        from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

        benchmark = rb_files.BENCHMARK.name
        try:
            if evaluating and self.recorder.store.exists(benchmark):
                return per_call_costs(plan_run(self.cfg, benchmark=self.recorder.store.uri(benchmark)))
            return per_call_costs(plan_run(self.cfg))
        except Exception as exc:  # no estimate: the budget still stops once the spend itself passes it
            self.recorder.note(
                f"budget_usd: no estimate of the calls to come ({type(exc).__name__}: {exc}); "
                "only the spend so far is checked"
            )
            return {}

    def shard_cost(self, stage: str, model: str, rows: int, fanned: list[str]) -> float:
        """The ceiling of one shard of ``rows`` rows for ``model``: its own calls and those of the
        stage's models no shard is for (the judge), one call each per row."""
        costs = self.per_call(stage)
        calling = [m for m in costs if m == model or m not in fanned]
        return rows * sum(costs[m] or 0.0 for m in calling)

    # ------------------------------------------------------------ the check

    def admit(self, stage: str, model: str, index: int, count: int, rows: int, fanned: list[str]) -> float:
        """The next shard's estimate when it fits the budget; else stop the run (:meth:`stop`)."""
        estimate = self.shard_cost(stage, model, rows, fanned)
        spent = self.spend.spent_usd()
        with self._lock:
            committed = spent + sum(self._reserved.values())
        self._display.show(spent, self.limit_usd, stage)
        if committed + estimate > self.limit_usd:
            self.stop(
                f"budget_usd: spent ${spent:,.4f} of ${self.limit_usd:,.2f} (${committed - spent:,.4f} more on "
                f"its way); stage {stage}: the next shard ({model}, shard {index + 1}/{count}, about "
                f"${estimate:,.4f}) would exceed it. Stopped; a re-run with a larger budget_usd resumes here"
            )
        return estimate

    def track(self, future: Any, estimate: float) -> None:
        """Count ``future``'s estimate as committed until it is done."""
        key = id(future)
        with self._lock:
            self._reserved[key] = estimate
            self._futures.append(future)
        future.add_done_callback(lambda _done: self._release(key))

    def _release(self, key: int) -> None:
        with self._lock:
            self._reserved.pop(key, None)

    def stop(self, reason: str) -> None:
        """Let the shards on their way finish (cached for the re-run), record the costs, raise."""
        for future in list(self._futures):
            future.wait()
        self._display.show(self.spend.spent_usd(), self.limit_usd, "stopped")
        self.counter.record(self.recorder)
        self.recorder.note(reason)
        story("%s", reason)
        raise BudgetExceeded(reason)
