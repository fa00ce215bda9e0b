"""The run's budget (``budget_usd`` in the config), checked before each shard is sent.

- Spent so far: the cost of the new calls this command made (``runtime.CallCounter``), from the start
  of ``run`` (its generation and evaluation share one budget: :func:`budget_span`), of each refresh
  round, or of a ``generate``, ``evaluate``, ``pretest`` or ``knowornot run`` on its own. Calls served
  from the call cache or Prefect's task cache cost nothing new.
- The next shard: one call's ceiling (``budget_prices.call_ceiling``: its prompt tokens as ``plan``
  measures them, its output cap at ``max_tokens`` or the provider's cap; the batch price for a
  batch-mode model) times the shard's rows, for the model the shard is for and the stage's models no
  shard is for (the judge of a target's answers). A shard with calls of a priced model never counts as
  $0. Shards sent and not done count at their estimate until they are, so the spend exceeds the budget
  by no more than what the estimates of the shards in flight leave out; a batch-mode model's one shard
  of a stage (its whole batch job) is checked as one.
- Calls a task sends whole rather than the flow shard by shard (KnowOrNot's facts, QA pairs, HyDE answers,
  synthetic questions: :class:`AdmittedCalls`; its embedding requests: ``embedding_calls``) ask the budget
  through ``accounting.admitted`` (the flow sets the budget as the spend gate, which the task runner's
  threads inherit): each shard of them is checked the same way, at the sum of its calls' ceilings (an
  embedding request: its texts' tokens at the input price), and committed while it is sent.
- When the next shard would take the spend past the budget, nothing more is sent: the shards on
  their way finish (their calls go into the call cache, their results into Prefect's task cache),
  the manifest records the calls, costs, spend and the reason (``costs.budget``), and the run stops
  with :class:`BudgetExceeded` (exit 1, one line naming spend, budget and stage). A re-run with a
  larger budget finds what was done in the caches and sends only the rest.
- A model without a price is refused before the run (``budget_prices.check_budget_prices``) unless
  the config sets ``budget_unpriced: free``: then its calls count as $0, and a note says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import BudgetExceeded
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.calls import CallResult, CallSpec
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.plan_pricing import schema_chars
from refusalbench.tasks.pipeline.budget_prices import call_ceiling, text_tokens, unpriced
from refusalbench.tasks.pipeline.runtime import CallCounter
from refusalbench.tasks.pipeline.ui import SpendDisplay, story

EVALUATION_STAGES = ("respond", "judge", "calibrate")
# ``plan`` counts the calibration pass inside respond and judge: a calibrate shard costs what theirs do.
PLAN_STAGES = {"calibrate": ("respond", "judge")}
# The counter of the span a budget covers (``run``: generation and evaluation), when one is open.
_span: ContextVar[CallCounter | None] = ContextVar("refusalbench_budget_span", default=None)


def not_after_a_stop(task: Any, task_run: Any, state: Any) -> bool:
    """A task's ``retry_condition_fn``: retried after a failure, never after the budget stopped the run
    inside it (a retry would only be stopped again)."""
    try:
        state.result()
    except BudgetExceeded:
        return False
    except Exception:
        return True
    return True


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


def usd(amount: float) -> str:
    """Dollars as the budget's messages print them: cents, or four significant digits below a dollar."""
    return f"${amount:,.2f}" if amount >= 1 or amount == 0 else f"${amount:.4g}"


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
    # {stage: {model: USD per row}} when the run estimates its shards itself (KnowOrNot); else ``plan``'s.
    estimates: Callable[[str], dict[str, float]] | None = None
    _costs: dict[bool, dict[str, dict[str, float]]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _display: SpendDisplay = field(default_factory=SpendDisplay, init=False)
    stopped: str | None = field(default=None, init=False)  # why the run stopped, once it has

    def __post_init__(self) -> None:
        self.counter = CallCounter(self.cfg)
        self.spend = _span.get() or self.counter

    @classmethod
    def of(
        cls,
        cfg: RunConfig,
        recorder: ManifestRecorder,
        estimates: Callable[[str], dict[str, float]] | None = None,
    ) -> Budget | None:
        return cls(cfg, recorder, cfg.budget_usd, estimates=estimates) if cfg.budget_usd is not None else None

    # ------------------------------------------------------------ the estimate

    def per_call(self, stage: str) -> dict[str, float]:
        """Each model's ceiling per row of a shard of ``stage``: from ``estimates`` where the run gives them
        (KnowOrNot), else ``plan``'s prompts (once per run for the generation stages, once for the evaluation
        stages, on the benchmark this run evaluates when it is placed)."""
        if self.estimates is not None:
            return self.estimates(stage)
        evaluating = stage in EVALUATION_STAGES
        if evaluating not in self._costs:
            self._costs[evaluating] = self._plan_costs(evaluating)
            self._note_free({m for models in self._costs[evaluating].values() for m in models})
        costs = self._costs[evaluating]
        return {model: cost for name in PLAN_STAGES.get(stage, (stage,)) for model, cost in costs.get(name, {}).items()}

    def _note_free(self, models: set[str]) -> None:
        counted_free = unpriced(self.cfg, models)
        if counted_free:
            self.recorder.note(
                f"budget_unpriced: free: the calls of {', '.join(counted_free)} (no price) count as $0 against "
                "budget_usd"
            )

    def _plan_costs(self, evaluating: bool) -> dict[str, dict[str, float]]:
        from refusalbench.tasks.refusalbench.plan.estimate import plan_run
        from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

        benchmark = rb_files.BENCHMARK.name
        try:
            if evaluating and self.recorder.store.exists(benchmark):
                plan = plan_run(self.cfg, benchmark=self.recorder.store.uri(benchmark))
            else:
                plan = plan_run(self.cfg)
        except Exception as exc:  # no plan: each shard's own model counts at its output cap alone
            self.recorder.note(
                f"budget_usd: no plan of the calls to come ({type(exc).__name__}: {exc}); each shard is "
                "estimated at its model's output cap per row, without its prompt"
            )
            return {}
        return {
            stage: {
                model: call_ceiling(self.cfg, model, stage, m.input_tokens / m.calls if m.calls else 0.0)
                for model, m in plan_stage.models.items()
            }
            for stage, plan_stage in plan.stages.items()
        }

    def shard_cost(self, stage: str, model: str, rows: int, fanned: list[str]) -> float:
        """The ceiling of one shard of ``rows`` rows for ``model``: its own calls and those of the
        stage's models no shard is for (the judge), one call each per row."""
        costs = self.per_call(stage)
        if model not in costs and model in self.cfg.models:  # no plan of it: at least its own output cap
            costs = {**costs, model: call_ceiling(self.cfg, model, stage, 0.0)}
        calling = [m for m in costs if m == model or m not in fanned]
        return rows * sum(costs[m] for m in calling)

    # ------------------------------------------------------------ the check

    def admit(self, stage: str, model: str, index: int, count: int, rows: int, fanned: list[str]) -> float:
        """The next shard's estimate when it fits the budget; else stop the run (:meth:`stop`)."""
        estimate = self.shard_cost(stage, model, rows, fanned)
        self.check(stage, f"{model}, shard {index + 1}/{count}", estimate)
        return estimate

    def check(self, stage: str, what: str, estimate: float) -> None:
        """Stop the run (:meth:`stop`) unless ``what`` (the next shard), estimated at ``estimate``, fits."""
        if self.stopped is not None:  # a stage still sending after the stop (another base's task) stops too
            raise BudgetExceeded(self.stopped)
        spent = self.spend.spent_usd()
        with self._lock:
            committed = spent + sum(self._reserved.values())
        self._display.show(spent, self.limit_usd, stage)
        if committed + estimate > self.limit_usd:
            self.stop(
                f"budget_usd: spent {usd(spent)} of {usd(self.limit_usd)} ({usd(committed - spent)} more on its "
                f"way); stage {stage}: the next shard ({what}, about {usd(estimate)}) "
                "would exceed it. Stopped; a re-run with a larger budget_usd resumes here"
            )

    @contextmanager
    def admitted(self, stage: str, model: str, estimate_usd: float, what: str) -> Iterator[None]:
        """Calls sent inside a task rather than shard by shard from the flow (KnowOrNot's knowledge base,
        HyDE, synthetic questions, embeddings: ``accounting.admitted``): checked like a shard, their
        estimate committed while they are sent."""
        self.check(stage, f"{model}, {what}", estimate_usd)
        key = object()
        with self._lock:
            self._reserved[id(key)] = estimate_usd
        try:
            yield
        finally:
            self._release(id(key))

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
        with self._lock:
            if self.stopped is not None:
                raise BudgetExceeded(self.stopped)
            self.stopped = reason
        for future in list(self._futures):
            future.wait()
        spent = self.spend.spent_usd()
        self._display.show(spent, self.limit_usd, "stopped")
        self.counter.record(self.recorder)
        self.recorder.manifest.costs["budget"] = {"limit_usd": self.limit_usd, "spent_usd": spent, "stopped": reason}
        self.recorder.note(reason)
        story("%s", reason)
        raise BudgetExceeded(reason)


class AdmittedCalls:
    """A gateway whose ``complete_many`` sends a stage's calls ``shard_size`` at a time, each shard admitted
    by the run's budget first (``accounting.admitted``: the sum of its calls' ceilings, ``call_ceiling``);
    where no budget admits calls, all at once, as the gateway sends them. For the stages a task sends
    whole (KnowOrNot's facts, QA pairs, HyDE answers, synthetic questions)."""

    def __init__(self, gateway: Gateway, cfg: RunConfig, stage: str, shard_size: int):
        self.gateway, self.cfg, self.stage, self.shard_size = gateway, cfg, stage, max(1, shard_size)

    def complete_many(
        self, specs: Iterable[CallSpec], on_result: Callable[[CallResult], None] | None = None
    ) -> list[CallResult]:
        specs = list(specs)
        if not accounting.gated():
            return self.gateway.complete_many(specs, on_result=on_result)
        billed_as = accounting.current_stage()  # the stage the calls count for: a batch-mode model's batch price
        shards = [specs[i : i + self.shard_size] for i in range(0, len(specs), self.shard_size)]
        results: list[CallResult] = []
        for index, shard in enumerate(shards):
            estimate = sum(self._ceiling(spec, billed_as) for spec in shard)
            with accounting.admitted(self.stage, shard[0].model, estimate, f"shard {index + 1}/{len(shards)}"):
                results += self.gateway.complete_many(shard, on_result=on_result)
        return results

    def _ceiling(self, spec: CallSpec, stage: str) -> float:
        model = self.cfg.models[spec.model]
        chars = sum(len(str(m.get("content") or "")) for m in spec.messages) + schema_chars(model, spec.schema_)
        return call_ceiling(self.cfg, spec.model, stage, text_tokens(chars))
