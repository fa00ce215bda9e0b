"""A plan before spending: the calls, tokens, dollars and hours a run of a config would take.

``plan_run`` makes no model call. Per stage (pretest, generate, verify, respond, judge) and per
model it counts the calls a run with an empty call cache would send, estimates their input
tokens by rendering the real templates on the real base set, bounds their output tokens by the
model's ``params.max_tokens``, prices both with LiteLLM's offline price map and bounds the time
from ``max_concurrency``, ``rpm`` and each model's seconds per call (``llm/plan_latency.py``: measured
from past calls, the registry's figure for a local model, or the assumed ``--latency``). Pricing,
timing and summing are ``llm/plan_pricing.py``'s, shared with KnowOrNot's plan.

A stage with nothing to do (no generator, no verifier, no target, no benchmark item) is an
``InputError`` naming the stage: the run could not work. Models that ``skip_unavailable`` leaves out
are warnings instead: plans are made before keys are set.

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
max(calls x its seconds per call / max_concurrency, calls / rpm x 60); a stage takes as long as its slowest
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
from dataclasses import dataclass

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.plan_pricing import CHARS_PER_TOKEN, StageWork, counted, priced_plan, time_bound
from refusalbench.tasks.llm.plan_results import ModelPlan, Plan, PlanTotal, StagePlan
from refusalbench.tasks.refusalbench.basesets import load_configured_base_set
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.plan.prompt_sizes import (
    generation_prompts_for,
    judge_prompts_for,
    stand_in_item,
    target_prompts_for,
    verification_prompts_for,
)
from refusalbench.tasks.refusalbench.plan.table import plan_table
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, BenchmarkItem, Lever
from refusalbench.tasks.refusalbench.stages.assign import configured_strata, draw_assignments
from refusalbench.tasks.refusalbench.stages.generate import rule_candidates
from refusalbench.tasks.refusalbench.stages.select import stratum_quotas
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, STRATA, expected_behaviour

STAGES = ("pretest", "generate", "verify", "respond", "judge")


@dataclass
class _Generation:
    """What the generation side of a run would draw: items, assignments, and the benchmark ceiling."""

    all_items: list[BaseItem]
    items: list[BaseItem]
    assignments: list[Assignment]
    levers: dict[str, Lever]
    benchmark_max: int = 0
    answerable_max: int = 0
    rule_candidates: int = 0

    @property
    def items_by_id(self) -> dict[str, BaseItem]:
        return {item.id: item for item in self.items}


def _draw_generation(cfg: RunConfig, seed: int, generators: list[str]) -> _Generation:
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
    llm_generators = [m for m in generators if not cfg.models[m].rule_based]
    # Every LLM generator answers every assignment; the rule generator only those its rules realise.
    assigned = Counter(_stratum(a) for a in assignments)
    per_stratum = Counter({s: n * len(llm_generators) for s, n in assigned.items()})
    for model in generators:
        if cfg.models[model].rule_based:
            made = rule_candidates(assignments, drawn.items_by_id, drawn.levers, model)
            drawn.rule_candidates += len(made)
            per_stratum.update((c.perturbation_class, c.intensity) for c in made)
    ordered = [s for s in STRATA if s in assigned]
    # The quotas the stratified sample (select.stratified_sample) fills.
    quotas = stratum_quotas(gen.target_size, ordered) if gen.target_size and ordered else None
    for stratum in ordered:
        candidates = per_stratum[stratum]
        most = min(quotas[stratum], candidates) if quotas else candidates
        drawn.benchmark_max += most
        if expected_behaviour(*stratum) == ANSWER_CORRECTLY:
            drawn.answerable_max += most
    return drawn


def _stratum(assignment: Assignment) -> tuple[str, str]:
    return assignment.perturbation_class, assignment.intensity


def _generation_work(
    cfg: RunConfig,
    drawn: _Generation,
    generators: list[str],
    verifiers: list[str],
    pretest: list[str],
    judge: str | None,
) -> dict[str, StageWork]:
    gen, models = cfg.generation, cfg.models
    assert gen is not None, "plan_run plans the generation only for a config with a generation section"
    stages: dict[str, StageWork] = {}
    if gen.pretest is not None:
        n = len(drawn.all_items)
        work = StageWork(
            f"{counted(n, 'base item')} x {counted(len(pretest), 'pre-test model')} answer (exact); the judge "
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
    work = StageWork(
        f"{counted(len(drawn.items), 'base item')} -> {counted(a, 'assignment')} x "
        f"{counted(len(generators), 'generator')}{after_pretest}"
    )
    prompts = generation_prompts_for(drawn.assignments, drawn.items_by_id, drawn.levers)
    llm_generators = [m for m in generators if not models[m].rule_based]  # the rule generator makes no call
    for model in llm_generators:
        work.add(model, models[model], a, prompts, bounded=gen.pretest is not None, stage="generate")
    stages["generate"] = work

    candidates = a * len(llm_generators) + drawn.rule_candidates
    short_circuit = gen.verification == "short_circuit"
    work = StageWork(
        f"at most {counted(candidates, 'candidate')} x {counted(len(verifiers), 'verifier')} (only parsed candidates are "
        "sent" + ("; short_circuit drops those an earlier verifier failed)" if short_circuit else ")"),
        sequential=short_circuit,
    )
    prompts = verification_prompts_for(drawn.assignments, drawn.items_by_id, drawn.levers)
    sharing = max(1, round(candidates / a)) if a else 1  # a candidate per generator of each (item, lever)
    for model in verifiers:
        work.add(model, models[model], candidates, prompts, bounded=True, stage="verify", shared_by=sharing)
    stages["verify"] = work
    return stages


def _evaluation_work(
    cfg: RunConfig,
    targets: list[str],
    judge: str | None,
    *,
    benchmark: list[BenchmarkItem] | None,
    drawn: _Generation | None,
) -> dict[str, StageWork]:
    ev, models = cfg.evaluation, cfg.models
    assert ev is not None, "plan_run plans the evaluation only for a config with an evaluation section"
    if benchmark is not None:
        answerable = [item for item in benchmark if item.expected == ANSWER_CORRECTLY]
        shown_to_judge = benchmark if ev.decision == "judge" else answerable  # the judge classifies every reply
        size, judged, exact = len(benchmark), len(shown_to_judge), True
        respond_prompts = target_prompts_for(benchmark, protocol=ev.protocol)
        judge_prompts = judge_prompts_for(shown_to_judge, ev.protocol)
        calibration_prompts = target_prompts_for(benchmark, confidence=True) if ev.confidence else []
        respond_note = f"{counted(size, 'benchmark item')} x {counted(len(targets), 'target')} (exact)"
    else:
        assert drawn is not None, "without a benchmark file, the generation's draw stands in for it"
        stand_ins = [stand_in_item(item) for item in drawn.items]
        size, exact = drawn.benchmark_max, False
        judged = size if ev.decision == "judge" else drawn.answerable_max
        respond_prompts = target_prompts_for(stand_ins, protocol=ev.protocol)
        judge_prompts = judge_prompts_for(stand_ins, ev.protocol)
        calibration_prompts = target_prompts_for(stand_ins, confidence=True) if ev.confidence else []
        respond_note = (
            f"at most {counted(size, 'benchmark item')} (the sum over strata of min(quota, candidates)) x "
            f"{counted(len(targets), 'target')}"
        )
    respond = StageWork(respond_note)
    for model in targets:
        respond.add(model, models[model], size, respond_prompts, bounded=not exact, stage="respond")
    judge_work = StageWork(
        f"{counted(judged, 'item')} x {counted(len(targets), 'target')}: the judge classifies and grades every "
        "reply (protocol: paper)"
        if ev.protocol == "paper"
        else f"at most {counted(judged, 'item')} x {counted(len(targets), 'target')}: the judge classifies every reply "
        "but one that is only a refusal code"
        if ev.decision == "judge"
        else f"at most {counted(judged, 'answerable item')} x {counted(len(targets), 'target')}: only answers to "
        "answerable items are judged (decision: codes)"
    )
    if judge is not None:
        sharing = len(targets) * (2 if ev.confidence else 1)  # every target's reply to an item, both passes
        judge_work.add(
            judge, models[judge], judged * len(targets), judge_prompts, bounded=True, stage="judge", shared_by=sharing
        )
    if ev.confidence:
        # The calibration pass (App. F.2): every item again with the confidence prompt, judged alike. DESIGN
        # §4 names plan's stages, so its calls count in respond and judge, and their notes say so.
        for model in targets:
            respond.add(model, models[model], size, calibration_prompts, bounded=not exact, stage="calibrate")
        if judge is not None:
            judge_work.add(
                judge,
                models[judge],
                judged * len(targets),
                judge_prompts,
                bounded=True,
                stage="calibrate",
                shared_by=sharing,
            )
        respond.note += "; twice with the calibration pass (evaluation.confidence: the confidence prompt)"
        judge_work.note += "; twice with the calibration pass"
    work = {"respond": respond, "judge": judge_work}
    return work


def _nothing_to_do(cfg: RunConfig, field: str, problem: str) -> InputError:
    """A stage with nothing to do: the run could not work, so the plan says which stage and why."""
    return InputError(str(cfg.source), f"{field.split('.')[0]}: {problem}", field=field)


def _check_generation(cfg: RunConfig, drawn: _Generation) -> None:
    """A generation that would make no benchmark item: exit 2, naming why (the config as written)."""
    gen = cfg.generation
    assert gen is not None, "checked only for a config with a generation section"
    if not gen.generators:
        raise _nothing_to_do(cfg, "generation.generators", "no generators")
    if not gen.verifiers:
        raise _nothing_to_do(cfg, "generation.verifiers", "no verifiers")
    if not drawn.all_items:
        raise _nothing_to_do(cfg, "generation.base_set", f"0 benchmark items: the base set {gen.base_set} is empty")
    if not drawn.items:
        raise _nothing_to_do(cfg, "generation.base_sample", "0 benchmark items: the base sample draws no item")
    if not drawn.assignments:
        raise _nothing_to_do(
            cfg,
            "generation.strata",
            f"0 benchmark items: no lever of the catalogue fits the strata for the {counted(len(drawn.items), 'base item')}",
        )
    if not drawn.benchmark_max:
        raise _nothing_to_do(
            cfg,
            "generation.generators",
            f"0 benchmark items: the generators make no candidate (the rule generator realises none of the "
            f"{counted(len(drawn.assignments), 'assignment')} and no LLM generator is named)",
        )


def _left_out(section: str, role: str, named: list[str], kept: list[str]) -> list[str]:
    """A warning when skip_unavailable leaves out every model of a role: the run would stop there."""
    if not named or kept:
        return []
    return [
        f"{section}: every {role} is left out as unavailable ({', '.join(named)}): the run would stop here; "
        "set their credentials or plan with --all-models"
    ]


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
    A stage with nothing to do is an :class:`InputError` naming the stage.
    """
    if latency_s <= 0:
        raise ValueError(f"latency_s must be positive, got {latency_s}")
    keep = (lambda names: [n for n in names if n in available]) if available is not None else list
    notes = [
        f"tokens estimated as characters / {CHARS_PER_TOKEN} of the rendered prompts (no tokenizer offline)",
        "time per model = max(calls x its seconds per call / max_concurrency, calls / rpm x 60); the models of "
        "a stage run in parallel, the stages one after another; retries and cached calls are not counted",
        "output tokens and cost_usd are ceilings: every call is counted at the model's max_tokens",
    ]
    warnings: list[str] = []
    work: dict[str, StageWork] = {}
    drawn = None
    gen, ev = cfg.generation, cfg.evaluation
    if benchmark is None and gen is not None:
        run_seed = gen.seed if seed is None else seed
        drawn = _draw_generation(cfg, run_seed, gen.generators)
        _check_generation(cfg, drawn)
        generators, verifiers = keep(gen.generators), keep(gen.verifiers)
        warnings += _left_out("generation", "generator", gen.generators, generators)
        warnings += _left_out("generation", "verifier", gen.verifiers, verifiers)
        if generators != gen.generators:
            drawn = _draw_generation(cfg, run_seed, generators)
        pretest = keep(gen.pretest.models) if gen.pretest else []
        pretest_judge = (keep([gen.pretest.judge]) or [None])[0] if gen.pretest else None
        work.update(_generation_work(cfg, drawn, generators, verifiers, pretest, pretest_judge))
        if gen.pretest is not None:
            warnings += _left_out("pretest", "pre-test model", gen.pretest.models, pretest)
            notes.append(
                "pretest assumes one answer per (item, model) with the target template and at most one "
                "judge call per answer with the judge template"
            )
    if ev is not None and (benchmark is not None or drawn is not None):
        if not ev.targets:
            raise _nothing_to_do(cfg, "evaluation.targets", "no targets")
        items = read_benchmark(benchmark) if benchmark is not None else None
        if items is not None and not items:
            raise _nothing_to_do(cfg, "evaluation", f"0 benchmark items in {benchmark}")
        judge = (keep([ev.judge]) or [None])[0]
        targets = keep(ev.targets)
        warnings += _left_out("evaluation", "target", ev.targets, targets)
        warnings += _left_out("evaluation", "judge", [ev.judge], [judge] if judge else [])
        work.update(_evaluation_work(cfg, targets, judge, benchmark=items, drawn=drawn))
        if benchmark is None:
            notes.append("respond and judge prompts are rendered on the base items, stand-ins for their perturbations")
    elif ev is not None:
        raise InputError(
            str(cfg.source),
            "planning an evaluation without a generation section needs the benchmark file it will evaluate",
            field="evaluation",
        )
    if not work:
        raise InputError(
            str(cfg.source), "nothing to plan: the config has no generation, evaluation or knowornot section"
        )
    if available is not None:
        skipped = sorted(set(cfg.used_models()) - set(available))
        if skipped:
            notes.append(f"left out as unavailable: {', '.join(skipped)}")
    ordered = {name: work[name] for name in STAGES if name in work}
    uses = [*(gen_models(cfg) if benchmark is None else []), *([*ev.targets, ev.judge] if ev else [])]
    return priced_plan(cfg, ordered, latency_s=latency_s, notes=notes, warnings=warnings, uses=uses)


def gen_models(cfg: RunConfig) -> list[str]:
    """The models the generation side of a run names (pre-test included)."""
    gen = cfg.generation
    if gen is None:
        return []
    pretest = [*gen.pretest.models, gen.pretest.judge] if gen.pretest else []
    return [*gen.generators, *gen.verifiers, *pretest]


__all__ = ["CHARS_PER_TOKEN", "ModelPlan", "Plan", "PlanTotal", "StagePlan", "plan_run", "plan_table", "time_bound"]
