"""The contamination check: a static benchmark against a fresh round of the same strata (paper §3.1).

static set -> targets respond -> judge -> score (``DIR/static``); the config's generation, limited to
the static set's class x intensity strata -> fresh benchmark -> the same evaluation (``DIR/fresh``);
then the gaps fresh - static with cluster-bootstrap intervals and FDR-controlled flags
(``tasks/refusalbench/rounds/contamination.py``) into ``DIR/contamination.json`` and ``contamination.html``.
One ``budget_usd`` covers all of it, as in ``run``. A refresh round with ``refresh.contamination_static``
runs the same comparison against its own fresh evaluation (:func:`round_contamination`).
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, configured, model_endpoints
from refusalbench.flows.evaluation import check_evaluation_inputs, evaluation_flow
from refusalbench.flows.generation import check_generation_inputs, generation_flow, with_strata
from refusalbench.flows.pretest import pretest_models
from refusalbench.flows.results import ContaminationResult
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget import budget_span
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.contamination_step import Written, record_contamination, static_strata
from refusalbench.tasks.refusalbench.rounds.contamination import FRESH_FOLDER, STATIC_FOLDER


def check_contamination_inputs(cfg: RunConfig, static: str, seed: int | None = None) -> list[str]:
    """The static set, the config's evaluation and generation and every model, checked before any call
    (exit 2); returns the static set's strata, the fresh round's."""
    check_evaluation_inputs(cfg, static)  # no evaluation section or a bad file: one line
    if cfg.generation is None:
        raise InputError(
            cfg.source or "config", "contamination needs a generation section: it generates the fresh round"
        )
    strata = static_strata(static)
    check_budget_prices(cfg, cfg.used_models())
    check_generation_inputs(with_strata(cfg, strata), seed)
    for names in (cfg.generation.generators, cfg.generation.verifiers, cfg.evaluation_section().targets):
        check_or_raise(cfg, names)
    check_or_raise(cfg, [cfg.evaluation_section().judge])
    pretest_models(cfg)
    return strata


@flow(name="refusalbench-contamination", log_prints=True)
def contamination_flow(config_path: str, static: str, out: str, seed: int | None = None) -> ContaminationResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = load_config(config_path)
    strata = check_contamination_inputs(cfg, static, seed)  # a deployment starts here, without the CLI's check
    root = ArtifactStore(out)
    static_dir, fresh_dir = root.child(STATIC_FOLDER).uri(""), root.child(FRESH_FOLDER).uri("")
    with model_endpoints(cfg, cfg.used_models()), budget_span(cfg):  # one budget_usd for the three flows
        configured(evaluation_flow, cfg, static_dir)(config_path, static, static_dir)
        generated = configured(generation_flow, cfg, fresh_dir)(
            config_path, fresh_dir, seed, report=False, strata=strata
        )
        if generated.sampled == 0:
            raise RuntimeError(f"the fresh round is empty: no candidate passed verification (see {fresh_dir})")
        configured(evaluation_flow, cfg, fresh_dir)(config_path, generated.benchmark, fresh_dir)
    written = record_contamination(cfg, root, static, ArtifactStore(static_dir), ArtifactStore(fresh_dir))
    return _result(written, static_dir, fresh_dir)


def round_contamination(cfg: RunConfig, config_path: str, round_folder: str) -> Written | None:
    """A refresh round's check against ``refresh.contamination_static``: the static set evaluated into the
    round's ``static/`` folder, compared with the round's own evaluation; None without the key."""
    static = pinned_static(cfg)
    if static is None:
        return None
    round_store = ArtifactStore(round_folder)
    static_dir = round_store.child(STATIC_FOLDER).uri("")
    configured(evaluation_flow, cfg, static_dir)(config_path, static, static_dir)
    return record_contamination(cfg, round_store, static, ArtifactStore(static_dir), round_store)


def pinned_static(cfg: RunConfig) -> str | None:
    """``refresh.contamination_static`` resolved against the config file (a missing file: exit 2 at its line)."""
    value = cfg.refresh.contamination_static
    return None if value is None else cfg.input_path(value, ("refresh", "contamination_static"))


def _result(written: Written, static_dir: str, fresh_dir: str) -> ContaminationResult:
    return ContaminationResult(
        document=written.json_uri,
        report=written.html_uri,
        static_run=static_dir,
        fresh_run=fresh_dir,
        flagged=written.flagged,
    )
