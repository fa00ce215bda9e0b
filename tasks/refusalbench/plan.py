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
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from refusalbench.tasks.refusalbench.assign import configured_strata, draw_assignments
from refusalbench.tasks.refusalbench.basesets import load_base_set
from refusalbench.tasks.refusalbench.benchmark_file import read_benchmark
from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.context_limits import overflow
from refusalbench.tasks.llm.gateway import json_schema
from refusalbench.tasks.llm.providers import SCHEMA_MODES, profile_for, structured_mode
from refusalbench.tasks.refusalbench.generate import generation_messages, rule_candidates
from refusalbench.tasks.refusalbench.judge import judge_messages, judge_schema
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.records import Assignment, BaseItem, BenchmarkItem, Candidate, Lever, Response
from refusalbench.tasks.refusalbench.respond import target_messages
from refusalbench.tasks.refusalbench.select import stratum_quotas
from refusalbench.tasks.llm.structured_outputs import GeneratorMultiOutput, GeneratorSingleOutput, VerifierOutput
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, STRATA, expected_behaviour
from refusalbench.tasks.refusalbench.verify import verification_messages

CHARS_PER_TOKEN = 4
STAGES = ("pretest", "generate", "verify", "respond", "judge")

# (characters of the messages, response schema, the messages)
Prompt = tuple[int, type[BaseModel] | None, list[dict[str, str]]]


class ModelPlan(BaseModel):
    calls: int
    upper_bound: bool
    input_tokens: int
    output_tokens_max: int | None = Field(description="calls x max_tokens; None when max_tokens is not set")
    input_cost_usd: float | None = Field(description="the input's cost; None when the price is unknown")
    cost_usd: float | None = Field(description="input + output ceiling; None when the price or max_tokens is unknown")
    time_bound_s: float
    too_long: int = Field(default=0, description="calls whose prompt does not fit the model's context window less "
                                                 "max_tokens: recorded too_long, not sent (context_limits)")


class StagePlan(BaseModel):
    calls: int
    by_model: dict[str, int]
    upper_bound: bool = Field(description="calls depend on earlier outcomes: the count is a ceiling")
    input_tokens: int
    output_tokens_max: int | None
    input_cost_usd: float | None
    cost_usd: float | None
    time_bound_s: float
    models: dict[str, ModelPlan]
    note: str


class PlanTotal(BaseModel):
    calls: int
    upper_bound: bool
    input_tokens: int
    output_tokens_max: int | None
    input_cost_usd: float | None
    cost_usd: float | None = Field(description="None as soon as one model's cost is unknown; never a silent 0")
    priced_cost_usd: float = Field(description="the ceiling summed over the models whose cost is known")
    unpriced_models: list[str]
    time_bound_s: float


class Plan(BaseModel):
    config: str | None
    latency_s: float
    stages: dict[str, StagePlan]
    total: PlanTotal
    notes: list[str]


@dataclass
class _StageWork:
    """Calls and input characters per model of one stage, before pricing."""

    note: str
    sequential: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    chars: Counter[str] = field(default_factory=Counter)
    bounded: set[str] = field(default_factory=set)  # models whose count is a ceiling
    too_long: Counter[str] = field(default_factory=Counter)  # calls whose prompt exceeds the model's window

    def add(self, model: str, cfg: ModelConfig, calls: int, prompts: list[Prompt], *, bounded: bool) -> None:
        """``calls`` calls whose prompts look like ``prompts`` on average (all of them when equal in number)."""
        self.calls[model] += calls
        if bounded:
            self.bounded.add(model)
        if prompts and calls:
            total = sum(chars + _schema_chars(cfg, schema) for chars, schema, _ in prompts)
            self.chars[model] += round(total * calls / len(prompts))
            over = sum(_too_long(cfg, messages, schema) for _, schema, messages in prompts)
            self.too_long[model] += round(over * calls / len(prompts))


def _message_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _prompt(messages: list[dict[str, str]], schema: type[BaseModel] | None) -> Prompt:
    return _message_chars(messages), schema, messages


def _too_long(cfg: ModelConfig, messages: list[dict[str, str]], schema: type[BaseModel] | None) -> bool:
    """Whether the gateway would record this prompt too_long for ``cfg`` instead of sending it."""
    sent = json_schema(schema) if schema is not None and _schema_chars(cfg, schema) else None
    return overflow(cfg, messages, _max_tokens(cfg), sent) is not None


def _schema_chars(cfg: ModelConfig, schema: type[BaseModel] | None) -> int:
    # In the json_schema and tool modes the whole schema travels with the request; in json_object
    # mode only {"type": "json_object"}, in none nothing (the model's provider profile decides).
    if schema is None or structured_mode(cfg, profile_for(cfg.model, cfg.api_base)) not in SCHEMA_MODES:
        return 0
    return len(json.dumps(json_schema(schema)))


def _stand_in(item: BaseItem) -> BenchmarkItem:
    """A base item dressed as an answerable benchmark item, for rendering target and judge prompts."""
    return BenchmarkItem(item_id=item.id, base_id=item.id, variant=item.variant, perturbation_class="-",
                         intensity="LOW", lever_id="-", generator="-", question=item.question, context=item.context,
                         passages=item.passages, original_question=item.question, original_context=item.context,
                         original_passages=item.passages, answers=item.answers, expected=ANSWER_CORRECTLY,
                         domain=item.domain)


def _target_prompts(items: list[BenchmarkItem], confidence: bool = False) -> list[Prompt]:
    return [_prompt(target_messages(item, confidence), None) for item in items]


def _judge_prompts(items: list[BenchmarkItem]) -> list[Prompt]:
    prompts: list[Prompt] = []
    for item in items:
        stand_in = Response(item_id=item.item_id, model="-", raw=item.answers[0] if item.answers else "")
        prompts.append(_prompt(judge_messages(item, stand_in), judge_schema(item)))
    return prompts


def _generation_prompts(assignments: list[Assignment], items: dict[str, BaseItem],
                        levers: dict[str, Lever]) -> list[Prompt]:
    return [_prompt(generation_messages(items[a.base_id], levers[a.lever_id]),
                    GeneratorMultiOutput if a.variant == "multi" else GeneratorSingleOutput) for a in assignments]


def _verification_prompts(assignments: list[Assignment], items: dict[str, BaseItem],
                          levers: dict[str, Lever]) -> list[Prompt]:
    prompts: list[Prompt] = []
    for a in assignments:
        item, lever = items[a.base_id], levers[a.lever_id]
        # The candidate's perturbed text is not known yet: the original stands in for it.
        stand_in = Candidate(candidate_id="-", assignment_id=a.assignment_id, base_id=a.base_id, lever_id=a.lever_id,
                             perturbation_class=a.perturbation_class, intensity=a.intensity, variant=a.variant,
                             generator="-", status="ok", question=item.question, context=item.context,
                             passages=item.passages, expected=lever.expected, prompt_hash="-")
        prompts.append(_prompt(verification_messages(stand_in, item, lever), VerifierOutput))
    return prompts


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
    all_items = load_base_set(cfg.resolve_path(gen.base_set))
    catalogue = load_catalogue()
    items, assignments = draw_assignments(all_items, catalogue, configured_strata(cfg), gen.base_sample,
                                          gen.levers_per_stratum, seed, by=gen.base_sample_by)
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


def _generation_work(cfg: RunConfig, drawn: _Generation, generators: list[str], verifiers: list[str],
                     pretest: list[str], judge: str | None) -> dict[str, _StageWork]:
    gen, models = cfg.generation, cfg.models
    stages: dict[str, _StageWork] = {}
    if gen.pretest is not None:
        n = len(drawn.all_items)
        work = _StageWork(f"{n} base items x {len(pretest)} pre-test models answer (exact); the judge "
                          "scores each answer (at most one call per answer)")
        stand_ins = [_stand_in(item) for item in drawn.all_items]
        answer_prompts, judge_prompts = _target_prompts(stand_ins, False), _judge_prompts(stand_ins)
        for model in pretest:
            work.add(model, models[model], n, answer_prompts, bounded=False)
        if judge is not None:
            work.add(judge, models[judge], n * len(pretest), judge_prompts, bounded=True)
        stages["pretest"] = work

    a = len(drawn.assignments)
    after_pretest = " (at most: the pre-test may keep fewer items)" if gen.pretest is not None else ""
    work = _StageWork(f"{len(drawn.items)} base items -> {a} assignments x {len(generators)} generators{after_pretest}")
    prompts = _generation_prompts(drawn.assignments, drawn.items_by_id, drawn.levers)
    llm_generators = [m for m in generators if not models[m].rule_based]  # the rule generator makes no call
    for model in llm_generators:
        work.add(model, models[model], a, prompts, bounded=gen.pretest is not None)
    stages["generate"] = work

    candidates = a * len(llm_generators) + sum(len(rule_candidates(drawn.assignments, drawn.items_by_id, drawn.levers, m))
                                               for m in generators if models[m].rule_based)
    short_circuit = gen.verification == "short_circuit"
    work = _StageWork(f"at most {candidates} candidates x {len(verifiers)} verifiers (only parsed candidates are "
                      "sent" + ("; short_circuit drops those an earlier verifier failed)" if short_circuit else ")"),
                      sequential=short_circuit)
    prompts = _verification_prompts(drawn.assignments, drawn.items_by_id, drawn.levers)
    for model in verifiers:
        work.add(model, models[model], candidates, prompts, bounded=True)
    stages["verify"] = work
    return stages


def _evaluation_work(cfg: RunConfig, targets: list[str], judge: str | None, *, benchmark: list[BenchmarkItem] | None,
                     drawn: _Generation | None) -> dict[str, _StageWork]:
    ev, models = cfg.evaluation, cfg.models
    if benchmark is not None:
        answerable = [item for item in benchmark if item.expected == ANSWER_CORRECTLY]
        shown_to_judge = benchmark if ev.decision == "judge" else answerable  # the judge classifies every reply
        size, judged, exact = len(benchmark), len(shown_to_judge), True
        respond_prompts, judge_prompts = _target_prompts(benchmark), _judge_prompts(shown_to_judge)
        calibration_prompts = _target_prompts(benchmark, confidence=True) if ev.confidence else []
        respond_note = f"{size} benchmark items x {len(targets)} targets (exact)"
    else:
        stand_ins = [_stand_in(item) for item in drawn.items]
        size, exact = drawn.benchmark_max, False
        judged = size if ev.decision == "judge" else drawn.answerable_max
        respond_prompts, judge_prompts = _target_prompts(stand_ins), _judge_prompts(stand_ins)
        calibration_prompts = _target_prompts(stand_ins, confidence=True) if ev.confidence else []
        respond_note = (f"at most {size} benchmark items (the sum over strata of min(quota, candidates)) "
                        f"x {len(targets)} targets")
    respond = _StageWork(respond_note)
    for model in targets:
        respond.add(model, models[model], size, respond_prompts, bounded=not exact)
    judge_work = _StageWork(f"at most {judged} items x {len(targets)} targets: the judge classifies every reply "
                            "but one that is only a refusal code" if ev.decision == "judge" else
                            f"at most {judged} answerable items x {len(targets)} targets: only answers to "
                            "answerable items are judged (decision: codes)")
    if judge is not None:
        judge_work.add(judge, models[judge], judged * len(targets), judge_prompts, bounded=True)
    if ev.confidence:
        # The calibration pass (App. F.2): every item again with the confidence prompt, judged alike. DESIGN
        # §4 names plan's stages, so its calls count in respond and judge, and their notes say so.
        for model in targets:
            respond.add(model, models[model], size, calibration_prompts, bounded=not exact)
        if judge is not None:
            judge_work.add(judge, models[judge], judged * len(targets), judge_prompts, bounded=True)
        respond.note += "; twice with the calibration pass (evaluation.confidence: the confidence prompt)"
        judge_work.note += "; twice with the calibration pass"
    work = {"respond": respond, "judge": judge_work}
    return work


def _prices(cfg: RunConfig, names: Collection[str]) -> dict[str, tuple[float, float] | None]:
    """(input, output) USD per token: the config's ``price``, else LiteLLM's offline map; None: unknown, never $0."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    prices: dict[str, tuple[float, float] | None] = {}
    for name in names:
        if (price := cfg.models[name].price) is not None:  # the user's price overrides the map
            prices[name] = (price.input_per_mtok / 1e6, price.output_per_mtok / 1e6)
            continue
        if cfg.models[name].local is not None and not cfg.models[name].api_base:
            prices[name] = (0.0, 0.0)  # our own llama.cpp server: no provider bills these calls
            continue
        try:
            info = litellm.get_model_info(cfg.models[name].model)
        except Exception:  # "This model isn't mapped yet": self-hosted and local models
            prices[name] = None
            continue
        unit_in, unit_out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
        prices[name] = None if unit_in is None or unit_out is None else (float(unit_in), float(unit_out))
    return prices


def _max_tokens(cfg: ModelConfig) -> int | None:
    return profile_for(cfg.model, cfg.api_base).max_output_tokens(cfg.params)


def time_bound(cfg: ModelConfig, calls: int, latency_s: float) -> float:
    """Seconds ``calls`` calls need: limited by concurrency or by the rate limit, whichever is slower."""
    by_concurrency = calls * latency_s / cfg.max_concurrency
    by_rate = calls / cfg.rpm * 60 if cfg.rpm else 0.0
    return max(by_concurrency, by_rate)


def _sum_or_none(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else round(sum(values), 6)


def _price_stage(cfg: RunConfig, work: _StageWork, prices: dict[str, tuple[float, float] | None],
                 latency_s: float) -> StagePlan:
    models: dict[str, ModelPlan] = {}
    for name, calls in work.calls.items():
        mcfg = cfg.models[name]
        tokens_in = -(-work.chars[name] // CHARS_PER_TOKEN)
        ceiling = _max_tokens(mcfg)
        tokens_out = None if ceiling is None else calls * ceiling
        price = prices.get(name)
        cost_in = None if price is None else round(tokens_in * price[0], 6)
        cost = None if price is None or tokens_out is None else round(tokens_in * price[0] + tokens_out * price[1], 6)
        models[name] = ModelPlan(calls=calls, upper_bound=name in work.bounded, input_tokens=tokens_in,
                                 output_tokens_max=tokens_out, input_cost_usd=cost_in, cost_usd=cost,
                                 time_bound_s=round(time_bound(mcfg, calls, latency_s), 3),
                                 too_long=work.too_long[name])
    times = [m.time_bound_s for m in models.values()]
    outs = [m.output_tokens_max for m in models.values()]
    return StagePlan(
        calls=sum(m.calls for m in models.values()), by_model={k: m.calls for k, m in models.items()},
        upper_bound=bool(work.bounded), input_tokens=sum(m.input_tokens for m in models.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=_sum_or_none([m.input_cost_usd for m in models.values()]),
        cost_usd=_sum_or_none([m.cost_usd for m in models.values()]),
        time_bound_s=round(sum(times) if work.sequential else max(times, default=0.0), 3),
        models=models, note=work.note)


def plan_run(cfg: RunConfig, *, latency_s: float = 2.0, seed: int | None = None, benchmark: str | None = None,
             available: Collection[str] | None = None) -> Plan:
    """The plan of a run of ``cfg`` with an empty call cache (see the module doc); no model is called.

    Without ``benchmark``: the generation stages of ``cfg`` and an evaluation of the benchmark they
    would make. With ``benchmark`` (a benchmark file for ``evaluate``): its evaluation alone, exactly
    sized. ``seed`` overrides ``generation.seed`` as the run's ``--seed`` does. ``available``
    (optional): the models that can run; others are left out, as ``skip_unavailable`` would.
    """
    if latency_s <= 0:
        raise ValueError(f"latency_s must be positive, got {latency_s}")
    keep = (lambda names: [n for n in names if n in available]) if available is not None else list
    notes = [f"tokens estimated as characters / {CHARS_PER_TOKEN} of the rendered prompts (no tokenizer offline)",
             f"time per model = max(calls x {latency_s:g} s / max_concurrency, calls / rpm x 60); the models of a "
             "stage run in parallel, the stages one after another; retries and cached calls are not counted",
             "output tokens and cost_usd are ceilings: every call is counted at the model's max_tokens"]
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
            notes.append("pretest assumes one answer per (item, model) with the target template and at most one "
                         "judge call per answer with the judge template")
    if ev is not None and (benchmark is not None or drawn is not None):
        items = read_benchmark(benchmark) if benchmark is not None else None
        judge = (keep([ev.judge]) or [None])[0]
        work.update(_evaluation_work(cfg, keep(ev.targets), judge, benchmark=items, drawn=drawn))
        if benchmark is None:
            notes.append("respond and judge prompts are rendered on the base items, stand-ins for their perturbations")
    elif ev is not None:
        raise InputError(str(cfg.source), "planning an evaluation without a generation section needs the benchmark "
                                          "file it will evaluate", field="evaluation")
    if not work:
        raise InputError(str(cfg.source), "nothing to plan: the config has no generation or evaluation section")
    if available is not None:
        skipped = sorted(set(cfg.used_models()) - set(available))
        if skipped:
            notes.append(f"left out as unavailable: {', '.join(skipped)}")

    prices = _prices(cfg, {m for w in work.values() for m in w.calls})
    stages = {name: _price_stage(cfg, work[name], prices, latency_s) for name in STAGES if name in work}
    per_model = [m for s in stages.values() for m in s.models.items()]
    unpriced = sorted({name for name, m in per_model if m.cost_usd is None})
    no_price = sorted({name for name in unpriced if prices.get(name) is None})
    no_ceiling = sorted(set(unpriced) - set(no_price))
    if no_price:
        notes.append(f"no price in the config or LiteLLM's map (cost unknown, not zero): {', '.join(no_price)}")
    if no_ceiling:
        notes.append(f"no params.max_tokens, so output is unbounded: {', '.join(no_ceiling)}")
    outs = [s.output_tokens_max for s in stages.values()]
    total = PlanTotal(
        calls=sum(s.calls for s in stages.values()), upper_bound=any(s.upper_bound for s in stages.values()),
        input_tokens=sum(s.input_tokens for s in stages.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=_sum_or_none([s.input_cost_usd for s in stages.values()]),
        cost_usd=_sum_or_none([s.cost_usd for s in stages.values()]),
        priced_cost_usd=round(sum(m.cost_usd for _, m in per_model if m.cost_usd is not None), 6),
        unpriced_models=unpriced, time_bound_s=round(sum(s.time_bound_s for s in stages.values()), 3))
    return Plan(config=cfg.source, latency_s=latency_s, stages=stages, total=total, notes=notes)


# ---------------------------------------------------------------- text rendering


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _row(stage: str, model: str, part: ModelPlan | StagePlan | PlanTotal) -> tuple[str, ...]:
    money = "unknown" if part.cost_usd is None else f"{part.cost_usd:,.2f}"
    out = "unbounded" if part.output_tokens_max is None else f"{part.output_tokens_max:,}"
    return (stage, model, f"{'<=' if part.upper_bound else ''}{part.calls:,}", f"{part.input_tokens:,}", out, money,
            _duration(part.time_bound_s))


def plan_table(plan: Plan) -> str:
    """The plan as a text table: a row per stage and model, per stage and in total; then the notes."""
    header = ("stage", "model", "calls", "input tok", "output tok <=", "cost $ <=", "time")
    rows: list[tuple[str, ...]] = []
    for name, stage in plan.stages.items():
        rows += [_row(name, model, m) for model, m in stage.models.items()] + [_row(name, "(stage)", stage)]
    rows.append(_row("total", "", plan.total))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [f"Plan for {plan.config or 'config'} (<= : upper bound, the count depends on earlier outcomes)",
           line(header), line(tuple("-" * w for w in widths)), *map(line, rows)]
    priced = {m for stage in plan.stages.values() for m in stage.models} - set(plan.total.unpriced_models)
    if plan.total.cost_usd is None:
        known = f"cost of the priced models: <= ${plan.total.priced_cost_usd:,.2f}; " if priced else ""
        out.append(f"{known}cost unknown for: {', '.join(plan.total.unpriced_models)}")
    too_long = [f"  {name}: {model}: {m.too_long:,} of {m.calls:,}" for name, stage in plan.stages.items()
                for model, m in stage.models.items() if m.too_long]
    if too_long:
        out += ["prompts too long for the model's context window less max_tokens (recorded too_long, not sent):",
                *too_long]
    out += ["stage notes:", *(f"  {name}: {stage.note}" for name, stage in plan.stages.items())]
    out += ["assumptions:", *(f"  - {note}" for note in plan.notes)]
    return "\n".join(out)
