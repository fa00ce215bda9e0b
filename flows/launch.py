"""Starting a flow from the command line: check all input first, then run the configured flow.

Each ``run_*`` reads and checks everything it can without a model call — the config, the
base set or benchmark, the catalogue, whether the models can run — and reports a problem
as one line (exit 2) before a flow run, and so before its run folder, starts. Only then
is the flow started with the config's task runner and result storage in the run folder.

Each function imports its own flow: a process pays only for the stages it runs (the
KnowOrNot flow alone brings NLTK, ~2 s of start-up a RefusalBench run does not need). In
embedded mode each first finds or starts Prefect's background server
(``tasks/pipeline/prefect_server.py``), so a server it starts boots while the flow's modules
are imported and the inputs checked. As its flow run starts, each prints the run's page in
the Prefect UI on the terminal (stderr).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from refusalbench.flows.common import check_or_raise, configured
from refusalbench.flows.results import (
    ContaminationResult,
    EvaluationResult,
    GenerationResult,
    KnowOrNotResult,
    MainResult,
    PretestResult,
    RefreshResult,
)
from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.pipeline.prefect_server import embedded_api, wait_until_ready

if TYPE_CHECKING:
    from prefect import Flow

P = ParamSpec("P")
R = TypeVar("R")

_announced: set[str] = set()  # flow runs whose page was printed (a retried run enters Running again)
_last_page: list[str] = []  # the last top-level flow run's page, printed again when its command ends


def _print_ui_link(flow: Any, flow_run: Any, state: Any) -> None:
    """On-running hook: print a top-level flow run's page in the Prefect UI (sub-flows are listed there)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.utilities.urls import url_for

    if flow_run.parent_task_run_id is not None or str(flow_run.id) in _announced:
        return
    _announced.add(str(flow_run.id))
    link = url_for(flow_run)
    # Without a UI (a bare API), the run's id and the API it is on say where to find it.
    _last_page[:] = [link or f"{flow_run.id} (Prefect API {PREFECT_API_URL.value() or 'ephemeral'})"]
    if link:
        print(f"Prefect UI: {link}", file=sys.stderr, flush=True)


def last_flow_run_page() -> str | None:
    """The Prefect UI page of the last flow run this process started (its id and API without a UI)."""
    return _last_page[0] if _last_page else None


def announced(flow: Flow[P, R]) -> Flow[P, R]:
    """The flow, printing its run's Prefect UI page as the run starts; an error the CLI says in one line
    is not also printed with its traceback by Prefect."""
    from refusalbench.tasks.pipeline.runtime import quiet_clean_errors

    quiet_clean_errors()
    return flow.with_options(on_running=[*flow.on_running_hooks, _print_ui_link])


@embedded_api
def run_generation(
    config_path: str, out: str, seed: int | None = None, fresh: list[str] | None = None
) -> GenerationResult:
    from refusalbench.flows.generation import check_generation_inputs, generation_flow
    from refusalbench.flows.pretest import pretest_models

    cfg = load_config(config_path)
    check_generation_inputs(cfg, seed)
    generation = cfg.generation_section()
    check_or_raise(cfg, generation.generators)
    check_or_raise(cfg, generation.verifiers)
    pretest_models(cfg)
    return announced(configured(generation_flow, cfg, out))(config_path, out, seed, fresh=fresh)


@embedded_api
def run_pretest(config_path: str, out: str, fresh: list[str] | None = None) -> PretestResult:
    from refusalbench.flows.pretest import check_pretest_inputs, pretest_flow, pretest_models

    cfg = load_config(config_path)
    check_pretest_inputs(cfg)
    pretest_models(cfg)
    return announced(configured(pretest_flow, cfg, out))(config_path, out, fresh=fresh)


@embedded_api
def run_evaluation(config_path: str, benchmark: str, out: str, fresh: list[str] | None = None) -> EvaluationResult:
    from refusalbench.flows.evaluation import check_evaluation_inputs, evaluation_flow

    cfg = load_config(config_path)
    check_evaluation_inputs(cfg, benchmark)
    evaluation = cfg.evaluation_section()
    check_or_raise(cfg, evaluation.targets)
    check_or_raise(cfg, [evaluation.judge])
    return announced(configured(evaluation_flow, cfg, out))(config_path, benchmark, out, fresh=fresh)


@embedded_api
def run_main(config_path: str, out: str, seed: int | None = None, fresh: list[str] | None = None) -> MainResult:
    from refusalbench.flows.main import check_main_inputs, main_flow

    cfg = check_main_inputs(config_path, seed)
    return announced(configured(main_flow, cfg, out))(config_path, out, seed, fresh=fresh)


@embedded_api
def run_refresh(config_path: str, out_root: str, rounds_to_compare: int = 5, seed: int | None = None) -> RefreshResult:
    from refusalbench.flows.contamination import pinned_static
    from refusalbench.flows.main import check_main_inputs
    from refusalbench.flows.refresh import refresh_flow
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.rounds.trend import check_round_versions

    # Each round's main job configures its own runner and storage (round folder known only then).
    cfg = check_main_inputs(config_path)
    if (static := pinned_static(cfg)) is not None:  # refresh.contamination_static: checked before a round starts
        from refusalbench.tasks.pipeline.refusalbench.contamination_step import static_strata

        static_strata(static)
    check_round_versions(ArtifactStore(out_root))  # a round a newer refusalbench wrote: exit 2 before a new one
    wait_until_ready()
    return announced(refresh_flow)(config_path, out_root, rounds_to_compare, seed)


@embedded_api
def run_contamination(config_path: str, static: str, out: str, seed: int | None = None) -> ContaminationResult:
    from refusalbench.flows.contamination import check_contamination_inputs, contamination_flow

    cfg = load_config(config_path)
    check_contamination_inputs(cfg, static, seed)
    return announced(configured(contamination_flow, cfg, out))(config_path, static, out, seed)


@embedded_api
def run_knowornot(config_path: str, out: str) -> KnowOrNotResult:
    from refusalbench.flows.knowornot import knowornot_flow
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import (
        check_knowornot_inputs,
        warm_up_embedder,
        warm_up_overlap_audit,
    )

    cfg = load_config(config_path)
    check_knowornot_inputs(cfg)
    warm_up_embedder(cfg)  # the embedding model loads while the flow run starts
    warm_up_overlap_audit()  # and the audit's libraries are imported
    return announced(configured(knowornot_flow, cfg, out))(config_path, out)


def incomplete_line(result: EvaluationResult | MainResult | RefreshResult, strict: bool) -> str | None:
    """The line naming an evaluation's (or a refresh round's) incomplete targets (scored on less than
    ``min_coverage`` of their rows), or None; with ``strict`` a :class:`RunIncomplete` (exit 1) instead."""
    from refusalbench.tasks.core.errors import RunIncomplete

    incomplete = result.incomplete
    if not incomplete:
        return None
    listed = ", ".join(
        f"{model} ({100 * coverage:.1f}% of rows scored)" for model, coverage in sorted(incomplete.items())
    )
    if strict:
        raise RunIncomplete(f"--strict: {len(incomplete)} incomplete target(s): {listed}")
    return f"incomplete (listed unranked on the leaderboard): {listed}"
