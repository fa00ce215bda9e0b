"""``plan`` as text, for either method: a row per stage and model (with the seconds per call its time
bound assumes and where that figure comes from), per stage and in total; the warnings (missing
credentials, unknown prices, stages left without a model); the totals synchronous and through the
batch API; the prompt cache's forecast savings; the prompts too long; the stage notes and the assumptions."""

from __future__ import annotations

from refusalbench.tasks.llm.plan_results import ModelPlan, Plan, PlanTotal, StagePlan

FREE = "local, free"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _free(part: ModelPlan | StagePlan | PlanTotal, models: list[ModelPlan]) -> bool:
    """Whether every call of this row goes to a local model the run serves itself (no provider bills it)."""
    return bool(models) and all(m.free for m in models) and part.cost_usd is not None


def _row(stage: str, model: str, part: ModelPlan | StagePlan | PlanTotal, models: list[ModelPlan]) -> tuple[str, ...]:
    if not models and not part.calls:
        money = "no calls"
    elif _free(part, models):
        money = FREE
    else:
        money = "unknown" if part.cost_usd is None else f"{part.cost_usd:,.2f}"
    out = "unbounded" if part.output_tokens_max is None else f"{part.output_tokens_max:,}"
    mark = "~" if part.estimated else "<=" if part.upper_bound else ""
    pace = f"{part.latency_s:g} ({part.latency_source})" if isinstance(part, ModelPlan) and part.latency_s else ""
    return (
        stage,
        model,
        f"{mark}{part.calls:,}",
        f"{part.input_tokens:,}",
        out,
        money,
        pace,
        _duration(part.time_bound_s),
    )


def _model_cell(model: str, part: ModelPlan) -> str:
    """The model's name, marked where its calls go through the batch API (all of them, or how many)."""
    if not part.batch_calls:
        return model
    return f"{model} [batch]" if part.batch_calls == part.calls else f"{model} [batch {part.batch_calls:,}]"


def _money(cost: float | None, priced: float) -> str:
    return f"<= ${cost:,.2f}" if cost is not None else f"unknown (the priced models: <= ${priced:,.2f})"


def cost_lines(total: PlanTotal) -> list[str]:
    """The run's cost as configured, all synchronous and all through the batch API (where it differs)."""
    configured = _money(total.cost_usd, total.priced_cost_usd)
    sync = _money(total.sync_cost_usd, total.priced_sync_cost_usd)
    batch = _money(total.batch_cost_usd, total.priced_batch_cost_usd)
    if not total.batch_calls:
        return [f"cost, all synchronous (as configured): {sync}", f"cost, every model in mode: batch: {batch}"]
    batched = f"{total.batch_calls:,} of {total.calls:,} calls through the batch API"
    lines = [f"cost as configured ({batched}): {configured}", f"cost, all synchronous: {sync}"]
    if total.batch_calls != total.calls:
        lines.append(f"cost, every model in mode: batch: {batch}")
    return lines


def cache_lines(plan: Plan) -> list[str]:
    """The prompt cache's forecast per stage and model, where calls share a prefix long enough to cache."""
    lines = [
        f"  {name}: {model}: {m.cached_tokens:,} prompt tokens read from the cache, saving "
        + ("an unknown amount (no price)" if m.cached_savings_usd is None else f"${m.cached_savings_usd:,.2f}")
        for name, stage in plan.stages.items()
        for model, m in stage.models.items()
        if m.cached_tokens
    ]
    if not lines:
        return []
    return ["prompt caching (forecast: calls sharing a prompt prefix; not taken off the cost above):", *lines]


def plan_table(plan: Plan) -> str:
    """The plan as a text table: a row per stage and model, per stage and in total; then the warnings,
    the costs, the notes and the assumptions."""
    header = ("stage", "model", "calls", "input tok", "output tok <=", "cost $ <=", "s/call (source)", "time")
    rows: list[tuple[str, ...]] = []
    for name, stage in plan.stages.items():
        rows += [_row(name, _model_cell(model, m), m, [m]) for model, m in stage.models.items()]
        rows.append(_row(name, "(stage)", stage, list(stage.models.values())))
    every_model = [m for stage in plan.stages.values() for m in stage.models.values()]
    rows.append(_row("total", "", plan.total, every_model))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    method = "KnowOrNot plan" if plan.method == "knowornot" else "Plan"
    out = [
        f"{method} for {plan.config or 'config'} (<= : upper bound, the count depends on earlier outcomes; "
        "~ : an estimate from an assumed ratio)",
        line(header),
        line(tuple("-" * w for w in widths)),
        *map(line, rows),
    ]
    out += [f"warning: {text}" for text in plan.warnings]
    priced = {m for stage in plan.stages.values() for m in stage.models} - set(plan.total.unpriced_models)
    if plan.total.cost_usd is None:
        known = f"cost of the priced models: <= ${plan.total.priced_cost_usd:,.2f}; " if priced else ""
        out.append(f"{known}cost unknown for: {', '.join(plan.total.unpriced_models)}")
    if every_model and all(m.free for m in every_model):
        out.append("cost: none, every model is local (served by the run itself)")
    else:
        out += cost_lines(plan.total)
    out += cache_lines(plan)
    too_long = [
        f"  {name}: {model}: {m.too_long:,} of {m.calls:,}"
        for name, stage in plan.stages.items()
        for model, m in stage.models.items()
        if m.too_long
    ]
    if too_long:
        out += [
            "prompts too long for the model's context window less max_tokens (recorded too_long, not sent):",
            *too_long,
        ]
    out += ["stage notes:", *(f"  {name}: {stage.note}" for name, stage in plan.stages.items())]
    out += ["assumptions:", *(f"  - {note}" for note in plan.notes)]
    return "\n".join(out)
