"""A plan before spending: the calls, tokens, dollars and hours a run of a config would take.

``plan_run`` makes no model call. Per stage (pretest, generate, verify, respond, judge) and per
model it counts the calls a run with an empty call cache would send, estimates their input
tokens by rendering the real templates on the real base set, bounds their output tokens by the
model's ``params.max_tokens``, prices both with LiteLLM's offline price map and bounds the time
from ``max_concurrency``, ``rpm`` and an assumed latency per call.

Exact counts and upper bounds (``upper_bound`` says which):

- generate: exactly assignments x generators, drawn by the base sampling and lever assignment the
  generation flow uses (the same functions and seed); a bound when a pre-test comes first, since
  it may keep fewer items than ``base_sample``.
- pretest: exactly items x pre-test models answering, at most one judge call per answer.
- verify: at most every candidate for every verifier (unparsed candidates are not sent and, with
  ``short_circuit``, neither are those an earlier verifier failed).
- respond: at most the benchmark size per target, itself at most the sum over strata of
  min(stratum quota, candidates); exact when the benchmark file is given.
- judge: with ``evaluation.decision: judge``, at most one call per response (a reply that is only a
  refusal code and a failed call need none); with ``codes``, at most one per response to an
  answerable (LOW intensity) item: refusals and answers to unanswerable items need none.
- the calibration pass (``evaluation.confidence``): counted in respond and judge, which it doubles (the
  targets asked again with the confidence-eliciting prompt; the main responses keep the plain one).

Estimates, and what they assume: tokens are characters / 4 of the rendered messages plus the JSON
schema where the model's provider profile sends it (no tokenizer can be fetched offline); later
stages render on the base items as stand-ins for the perturbed items they will see; the judge sees the reference
answer as a stand-in response. Output tokens are a ceiling (calls x max_tokens), so ``cost_usd`` is
a ceiling and ``input_cost_usd`` the input's share. Retries are not counted. Time bound per model:
max(calls x latency / max_concurrency, calls / rpm x 60); a stage takes as long as its slowest
model (models run in parallel; short-circuit verifiers run one after another, so theirs add up);
the total is the sum over stages.

Prompts too long for a model: each rendered prompt is checked against the model's context window
less its ``max_tokens`` exactly as the gateway checks it before a call (``context_limits``: the
config's ``context_window`` or LiteLLM's, LiteLLM's token counter); ``too_long`` counts the calls
that would be recorded ``too_long`` instead of sent (scaled like the calls where stand-in prompts
are used), and the table lists them.

Batch mode (a model's ``mode: batch``, or per stage): its calls of that stage are priced at the
batch price (``plan_prices``: the config's, LiteLLM's map's, else half the synchronous price) and
bounded in time by its ``batch.max_wait_s`` (the provider's window) instead of its concurrency.
``cost_usd`` is the run as configured; ``sync_cost_usd`` every call synchronous; ``batch_cost_usd``
every model in batch mode (a provider without a batch API the gateway speaks stays synchronous);
``batch_calls`` how many calls the config sends as batches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench.basesets import load_configured_base_set
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.plan.prices import Rates, batch_provider, model_rates, sends_batches, sum_or_none
from refusalbench.tasks.refusalbench.plan.prompt_sizes import (
    Prompt,
    exceeds_window,
    generation_prompts_for,
    judge_prompts_for,
    max_tokens,
    schema_chars,
    stand_in_item,
    target_prompts_for,
    verification_prompts_for,
)
from refusalbench.tasks.refusalbench.plan.results import ModelPlan, Plan, PlanTotal, StagePlan
from refusalbench.tasks.refusalbench.plan.table import plan_table
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, BenchmarkItem, Lever
from refusalbench.tasks.refusalbench.stages.assign import configured_strata, draw_assignments
from refusalbench.tasks.refusalbench.stages.generate import rule_candidates
from refusalbench.tasks.refusalbench.stages.select import stratum_quotas
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, STRATA, expected_behaviour

CHARS_PER_TOKEN = 4
STAGES = ("pretest", "generate", "verify", "respond", "judge")


@dataclass
class _StageWork:
    """Calls and input characters per model of one stage, before pricing."""

    note: str
    sequential: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    chars: Counter[str] = field(default_factory=Counter)
    bounded: set[str] = field(default_factory=set)  # models whose count is a ceiling
    too_long: Counter[str] = field(default_factory=Counter)  # calls whose prompt exceeds the model's window
    batch_calls: Counter[str] = field(default_factory=Counter)  # of the calls, those sent through the batch API
    batch_chars: Counter[str] = field(default_factory=Counter)

    def add(
        self, model: str, cfg: ModelConfig, calls: int, prompts: list[Prompt], *, bounded: bool, stage: str
    ) -> None:
        """``calls`` calls whose prompts look like ``prompts`` on average (all of them when equal in number);
        ``stage``: the stage they count for (accounting's name: the calibration pass's is ``calibrate``)."""
        batch = sends_batches(cfg, stage)
        self.calls[model] += calls
        self.batch_calls[model] += calls if batch else 0
        if bounded:
            self.bounded.add(model)
        if prompts and calls:
            total = sum(chars + schema_chars(cfg, schema) for chars, schema, _ in prompts)
            self.chars[model] += round(total * calls / len(prompts))
            self.batch_chars[model] += round(total * calls / len(prompts)) if batch else 0
            over = sum(exceeds_window(cfg, messages, schema) for _, schema, messages in prompts)
            self.too_long[model] += round(over * calls / len(prompts))


@dataclass
class _Generation:
    """What the generation side of a run would draw: items, assignments, and the benchmark ceiling."""

    all_items: list[BaseItem]
    items: list[BaseItem]
    assignments: list[Assignment]
    levers: dict[str, Lever]
    benchmark_max: int = 0
    answerable_max: int = 0

    @property
    def items_by_id(self) -> dict[str, BaseItem]:
        return {item.id: item for item in self.items}


def _draw_generation(cfg: RunConfig, seed: int, generators: int) -> _Generation:
    """The base sample and lever assignment exactly as the generation flow draws them."""
    gen = cfg.generation
    assert gen is not None, "plan_run draws a generation only for a config with a generation section"
    all_items = load_configured_base_set(cfg)
    catalogue = load_catalogue()
    items, assignments = draw_assignments(
        all_items,
        catalogue,
        configured_strata(cfg),
        gen.base_sample,
        gen.levers_per_stratum,
        seed,
        by=gen.base_sample_by,
    )
    drawn = _Generation(all_items, items, assignments, {lever.id: lever for lever in catalogue})
    per_stratum = Counter((a.perturbation_class, a.intensity) for a in assignments)
    ordered = [s for s in STRATA if s in per_stratum]
    # The quotas the stratified sample (select.stratified_sample) fills.
    quotas = stratum_quotas(gen.target_size, ordered) if gen.target_size and ordered else None
    for stratum in ordered:
        candidates = per_stratum[stratum] * generators
        most = min(quotas[stratum], candidates) if quotas else candidates
        drawn.benchmark_max += most
        if expected_behaviour(*stratum) == ANSWER_CORRECTLY:
            drawn.answerable_max += most
    return drawn


def _generation_work(
    cfg: RunConfig,
    drawn: _Generation,
    generators: list[str],
    verifiers: list[str],
    pretest: list[str],
    judge: str | None,
) -> dict[str, _StageWork]:
    gen, models = cfg.generation, cfg.models
    assert gen is not None, "plan_run plans the generation only for a config with a generation section"
    stages: dict[str, _StageWork] = {}
    if gen.pretest is not None:
        n = len(drawn.all_items)
        work = _StageWork(
            f"{n} base items x {len(pretest)} pre-test models answer (exact); the judge "
            "scores each answer (at most one call per answer)"
        )
        stand_ins = [stand_in_item(item) for item in drawn.all_items]
        answer_prompts, judge_prompts = target_prompts_for(stand_ins, False), judge_prompts_for(stand_ins)
        for model in pretest:
            work.add(model, models[model], n, answer_prompts, bounded=False, stage="pretest")
        if judge is not None:
            work.add(judge, models[judge], n * len(pretest), judge_prompts, bounded=True, stage="pretest")
        stages["pretest"] = work

    a = len(drawn.assignments)
    after_pretest = " (at most: the pre-test may keep fewer items)" if gen.pretest is not None else ""
    work = _StageWork(f"{len(drawn.items)} base items -> {a} assignments x {len(generators)} generators{after_pretest}")
    prompts = generation_prompts_for(drawn.assignments, drawn.items_by_id, drawn.levers)
    llm_generators = [m for m in generators if not models[m].rule_based]  # the rule generator makes no call
    for model in llm_generators:
        work.add(model, models[model], a, prompts, bounded=gen.pretest is not None, stage="generate")
    stages["generate"] = work

    candidates = a * len(llm_generators) + sum(
        len(rule_candidates(drawn.assignments, drawn.items_by_id, drawn.levers, m))
        for m in generators
        if models[m].rule_based
    )
    short_circuit = gen.verification == "short_circuit"
    work = _StageWork(
        f"at most {candidates} candidates x {len(verifiers)} verifiers (only parsed candidates are "
        "sent" + ("; short_circuit drops those an earlier verifier failed)" if short_circuit else ")"),
        sequential=short_circuit,
    )
    prompts = verification_prompts_for(drawn.assignments, drawn.items_by_id, drawn.levers)
    for model in verifiers:
        work.add(model, models[model], candidates, prompts, bounded=True, stage="verify")
    stages["verify"] = work
    return stages


def _evaluation_work(
    cfg: RunConfig,
    targets: list[str],
    judge: str | None,
    *,
    benchmark: list[BenchmarkItem] | None,
    drawn: _Generation | None,
) -> dict[str, _StageWork]:
    ev, models = cfg.evaluation, cfg.models
    assert ev is not None, "plan_run plans the evaluation only for a config with an evaluation section"
    if benchmark is not None:
        answerable = [item for item in benchmark if item.expected == ANSWER_CORRECTLY]
        shown_to_judge = benchmark if ev.decision == "judge" else answerable  # the judge classifies every reply
        size, judged, exact = len(benchmark), len(shown_to_judge), True
        respond_prompts, judge_prompts = target_prompts_for(benchmark), judge_prompts_for(shown_to_judge)
        calibration_prompts = target_prompts_for(benchmark, confidence=True) if ev.confidence else []
        respond_note = f"{size} benchmark items x {len(targets)} targets (exact)"
    else:
        assert drawn is not None, "without a benchmark file, the generation's draw stands in for it"
        stand_ins = [stand_in_item(item) for item in drawn.items]
        size, exact = drawn.benchmark_max, False
        judged = size if ev.decision == "judge" else drawn.answerable_max
        respond_prompts, judge_prompts = target_prompts_for(stand_ins), judge_prompts_for(stand_ins)
        calibration_prompts = target_prompts_for(stand_ins, confidence=True) if ev.confidence else []
        respond_note = (
            f"at most {size} benchmark items (the sum over strata of min(quota, candidates)) x {len(targets)} targets"
        )
    respond = _StageWork(respond_note)
    for model in targets:
        respond.add(model, models[model], size, respond_prompts, bounded=not exact, stage="respond")
    judge_work = _StageWork(
        f"at most {judged} items x {len(targets)} targets: the judge classifies every reply "
        "but one that is only a refusal code"
        if ev.decision == "judge"
        else f"at most {judged} answerable items x {len(targets)} targets: only answers to "
        "answerable items are judged (decision: codes)"
    )
    if judge is not None:
        judge_work.add(judge, models[judge], judged * len(targets), judge_prompts, bounded=True, stage="judge")
    if ev.confidence:
        # The calibration pass (App. F.2): every item again with the confidence prompt, judged alike. DESIGN
        # §4 names plan's stages, so its calls count in respond and judge, and their notes say so.
        for model in targets:
            respond.add(model, models[model], size, calibration_prompts, bounded=not exact, stage="calibrate")
        if judge is not None:
            judge_work.add(judge, models[judge], judged * len(targets), judge_prompts, bounded=True, stage="calibrate")
        respond.note += "; twice with the calibration pass (evaluation.confidence: the confidence prompt)"
        judge_work.note += "; twice with the calibration pass"
    work = {"respond": respond, "judge": judge_work}
    return work


def time_bound(cfg: ModelConfig, calls: int, latency_s: float) -> float:
    """Seconds ``calls`` calls need: limited by concurrency or by the rate limit, whichever is slower."""
    by_concurrency = calls * latency_s / cfg.max_concurrency
    by_rate = calls / cfg.rpm * 60 if cfg.rpm else 0.0
    return max(by_concurrency, by_rate)


def _price_model(mcfg: ModelConfig, work: _StageWork, name: str, rates: Rates | None, latency_s: float) -> ModelPlan:
    """One model's calls of a stage: tokens, cost at each call's mode's price, and time."""
    calls, batch_calls = work.calls[name], work.batch_calls[name]
    tokens_in = -(-work.chars[name] // CHARS_PER_TOKEN)
    batch_in = -(-work.batch_chars[name] // CHARS_PER_TOKEN)
    ceiling = max_tokens(mcfg)
    tokens_out: int | None = None
    batch_out: int | None = None
    sync_out: int | None = None
    if ceiling is not None:
        tokens_out, batch_out = calls * ceiling, batch_calls * ceiling
        sync_out = tokens_out - batch_out
    cost_in = cost = sync_cost = batch_cost = None
    if rates is not None:  # the synchronous calls at the synchronous price, the batch calls at the batch price
        sync_in, sync_total = rates.cost(tokens_in - batch_in, sync_out, batch=False)
        queued_in, queued_total = rates.cost(batch_in, batch_out, batch=True)
        cost_in, cost = round(sync_in + queued_in, 6), sum_or_none([sync_total, queued_total])
        sync_cost = sum_or_none([rates.cost(tokens_in, tokens_out, batch=False)[1]])
        batch_cost = sum_or_none([rates.cost(tokens_in, tokens_out, batch=batch_provider(mcfg))[1]])
    # Batch calls are waited for up to the model's batch window, whatever its concurrency.
    seconds = time_bound(mcfg, calls - batch_calls, latency_s)
    if batch_calls:
        seconds = max(seconds, mcfg.batch.max_wait_s)
    return ModelPlan(
        calls=calls,
        upper_bound=name in work.bounded,
        input_tokens=tokens_in,
        output_tokens_max=tokens_out,
        input_cost_usd=cost_in,
        cost_usd=cost,
        time_bound_s=round(seconds, 3),
        too_long=work.too_long[name],
        batch_calls=batch_calls,
        sync_cost_usd=sync_cost,
        batch_cost_usd=batch_cost,
    )


def _price_stage(cfg: RunConfig, work: _StageWork, rates: dict[str, Rates | None], latency_s: float) -> StagePlan:
    models = {name: _price_model(cfg.models[name], work, name, rates.get(name), latency_s) for name in work.calls}
    times = [m.time_bound_s for m in models.values()]
    outs = [m.output_tokens_max for m in models.values()]
    return StagePlan(
        calls=sum(m.calls for m in models.values()),
        by_model={k: m.calls for k, m in models.items()},
        upper_bound=bool(work.bounded),
        input_tokens=sum(m.input_tokens for m in models.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=sum_or_none([m.input_cost_usd for m in models.values()]),
        cost_usd=sum_or_none([m.cost_usd for m in models.values()]),
        time_bound_s=round(sum(times) if work.sequential else max(times, default=0.0), 3),
        models=models,
        note=work.note,
        batch_calls=sum(m.batch_calls for m in models.values()),
        sync_cost_usd=sum_or_none([m.sync_cost_usd for m in models.values()]),
        batch_cost_usd=sum_or_none([m.batch_cost_usd for m in models.values()]),
    )


def plan_run(
    cfg: RunConfig,
    *,
    latency_s: float = 2.0,
    seed: int | None = None,
    benchmark: str | None = None,
    available: Collection[str] | None = None,
) -> Plan:
    """The plan of a run of ``cfg`` with an empty call cache (see the module doc); no model is called.

    Without ``benchmark``: the generation stages of ``cfg`` and an evaluation of the benchmark they
    would make. With ``benchmark`` (a benchmark file for ``evaluate``): its evaluation alone, exactly
    sized. ``seed`` overrides ``generation.seed`` as the run's ``--seed`` does. ``available``
    (optional): the models that can run; others are left out, as ``skip_unavailable`` would.
    """
    if latency_s <= 0:
        raise ValueError(f"latency_s must be positive, got {latency_s}")
    keep = (lambda names: [n for n in names if n in available]) if available is not None else list
    notes = [
        f"tokens estimated as characters / {CHARS_PER_TOKEN} of the rendered prompts (no tokenizer offline)",
        f"time per model = max(calls x {latency_s:g} s / max_concurrency, calls / rpm x 60); the models of a "
        "stage run in parallel, the stages one after another; retries and cached calls are not counted",
        "output tokens and cost_usd are ceilings: every call is counted at the model's max_tokens",
    ]
    work: dict[str, _StageWork] = {}
    drawn = None
    gen, ev = cfg.generation, cfg.evaluation
    if benchmark is None and gen is not None:
        generators = keep(gen.generators)
        pretest = keep(gen.pretest.models) if gen.pretest else []
        pretest_judge = (keep([gen.pretest.judge]) or [None])[0] if gen.pretest else None
        drawn = _draw_generation(cfg, gen.seed if seed is None else seed, len(generators))
        work.update(_generation_work(cfg, drawn, generators, keep(gen.verifiers), pretest, pretest_judge))
        if gen.pretest is not None:
            notes.append(
                "pretest assumes one answer per (item, model) with the target template and at most one "
                "judge call per answer with the judge template"
            )
    if ev is not None and (benchmark is not None or drawn is not None):
        items = read_benchmark(benchmark) if benchmark is not None else None
        judge = (keep([ev.judge]) or [None])[0]
        work.update(_evaluation_work(cfg, keep(ev.targets), judge, benchmark=items, drawn=drawn))
        if benchmark is None:
            notes.append("respond and judge prompts are rendered on the base items, stand-ins for their perturbations")
    elif ev is not None:
        raise InputError(
            str(cfg.source),
            "planning an evaluation without a generation section needs the benchmark file it will evaluate",
            field="evaluation",
        )
    if not work:
        raise InputError(str(cfg.source), "nothing to plan: the config has no generation or evaluation section")
    if available is not None:
        skipped = sorted(set(cfg.used_models()) - set(available))
        if skipped:
            notes.append(f"left out as unavailable: {', '.join(skipped)}")

    prices = model_rates(cfg, {m for w in work.values() for m in w.calls})
    stages = {name: _price_stage(cfg, work[name], prices, latency_s) for name in STAGES if name in work}
    per_model = [m for s in stages.values() for m in s.models.items()]
    unpriced = sorted({name for name, m in per_model if m.cost_usd is None})
    no_price = sorted({name for name in unpriced if prices.get(name) is None})
    no_ceiling = sorted(set(unpriced) - set(no_price))
    if no_price:
        notes.append(f"no price in the config or LiteLLM's map (cost unknown, not zero): {', '.join(no_price)}")
    if no_ceiling:
        notes.append(f"no params.max_tokens, so output is unbounded: {', '.join(no_ceiling)}")
    no_batch_api = sorted({name for name, _ in per_model if not batch_provider(cfg.models[name])})
    unbatched = [name for name in no_batch_api if cfg.models[name].mode != "sync"]
    if unbatched:
        notes.append(
            f"mode: batch, but no batch API the gateway speaks (OpenAI-style and Anthropic have one): "
            f"{', '.join(unbatched)}: sent, priced and timed synchronously"
        )
    if no_batch_api:
        notes.append(
            f"batch_cost_usd (every model in mode: batch) keeps these synchronous, their providers having no "
            f"batch API the gateway speaks: {', '.join(no_batch_api)}"
        )
    outs = [s.output_tokens_max for s in stages.values()]
    total = PlanTotal(
        calls=sum(s.calls for s in stages.values()),
        upper_bound=any(s.upper_bound for s in stages.values()),
        input_tokens=sum(s.input_tokens for s in stages.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=sum_or_none([s.input_cost_usd for s in stages.values()]),
        cost_usd=sum_or_none([s.cost_usd for s in stages.values()]),
        priced_cost_usd=round(sum(m.cost_usd for _, m in per_model if m.cost_usd is not None), 6),
        unpriced_models=unpriced,
        time_bound_s=round(sum(s.time_bound_s for s in stages.values()), 3),
        batch_calls=sum(s.batch_calls for s in stages.values()),
        sync_cost_usd=sum_or_none([s.sync_cost_usd for s in stages.values()]),
        batch_cost_usd=sum_or_none([s.batch_cost_usd for s in stages.values()]),
        priced_sync_cost_usd=round(sum(m.sync_cost_usd for _, m in per_model if m.sync_cost_usd is not None), 6),
        priced_batch_cost_usd=round(sum(m.batch_cost_usd for _, m in per_model if m.batch_cost_usd is not None), 6),
    )
    if total.batch_calls:
        notes.append(
            "batch-mode calls are priced at the batch price and take up to the model's batch.max_wait_s "
            "(the provider's window; most batches finish sooner); items a batch fails are sent synchronously"
        )
    return Plan(config=cfg.source, latency_s=latency_s, stages=stages, total=total, notes=notes)


__all__ = ["CHARS_PER_TOKEN", "ModelPlan", "Plan", "PlanTotal", "StagePlan", "plan_run", "plan_table", "time_bound"]
