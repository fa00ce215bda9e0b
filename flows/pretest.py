"""The pre-test flow on its own: which base items every pre-test model answers correctly.

The same stage the generation flow runs first when ``generation.pretest`` is set, here with
nothing after it: ``pretest.parquet`` and the base-set funnel (imported -> pretested -> kept
-> sampled, where sampled is the draw a generation run of this config would make). The
answers land in the call cache, so a generation run of the same config afterwards pays for
none of them again.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints
from refusalbench.flows.results import PretestResult
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.cache_scoping import scoped_config
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.assign_step import (
    GenerationInputs,
    base_set_funnel,
    prepare_inputs,
    record_domain_draw,
    record_funnel,
)
from refusalbench.tasks.pipeline.refusalbench.pretest_step import pretest_base_set
from refusalbench.tasks.pipeline.runtime import CallCounter
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files


def _no_pretest(cfg: RunConfig) -> InputError:
    """The one line (exit 2) for a config whose generation section has no pre-test."""
    return InputError(
        str(cfg.source), "the config has no generation.pretest section (models and judge)", field="generation.pretest"
    )


def check_pretest_inputs(cfg: RunConfig) -> GenerationInputs:
    """The base set and the generation settings, checked; a config without a pre-test is bad input."""
    if cfg.generation is not None and cfg.generation.pretest is None:
        raise _no_pretest(cfg)
    inputs = prepare_inputs(cfg, cfg.generation.seed if cfg.generation else 0)
    pretest = cfg.generation_section().pretest
    check_budget_prices(cfg, [*pretest.models, pretest.judge] if pretest is not None else [])
    return inputs


def pretest_models(cfg: RunConfig) -> tuple[list[str], str | None]:
    """(the pre-test models that can run, the judge); ([], None) without a pre-test. Exits 2 when
    none of the models or not the judge can run (unless skip_unavailable skips some models)."""
    if cfg.generation is None or cfg.generation.pretest is None:
        return [], None
    models = check_or_raise(cfg, cfg.generation.pretest.models)
    (judge,) = check_or_raise(cfg, [cfg.generation.pretest.judge])
    return models, judge


@flow(name="refusalbench-pretest", log_prints=True)
def pretest_flow(config_path: str, out: str, fresh: list[str] | None = None) -> PretestResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = scoped_config(load_config(config_path), out, fresh=fresh)  # the run's cache scope
    counter = CallCounter(cfg)  # this run's calls only: the process may have run other flows before
    inputs = check_pretest_inputs(cfg)
    recorder = ManifestRecorder(ArtifactStore(out), "pretest", config=cfg, seed=inputs.seed)
    with recorder.run():
        models, judge = pretest_models(cfg)
        if judge is None:  # never: check_pretest_inputs refused a config without a pre-test
            raise _no_pretest(cfg)
        with model_endpoints(cfg, [*models, judge]) as api_bases:
            run = StageRun(cfg, out, recorder, api_bases)
            outcome = pretest_base_set(run, inputs.base_set, models, judge)
        drawn = inputs.drawn_from(outcome.kept)  # the draw a generation run of this config would make
        funnel = base_set_funnel(drawn, outcome.funnel)
        record_funnel(recorder, funnel)
        record_domain_draw(recorder, drawn)
        counter.record(recorder)
    return PretestResult(
        pretest=run.store.uri(rb_files.PRETEST.name),
        kept=[item.id for item in outcome.kept],
        funnel=funnel,
        run=run.store.uri(""),
    )
