"""The paper's two benchmarks as configs (issue 14, part 4): they validate offline and can be planned."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from refusalbench.tasks.core.config import GenerationConfig, load_config, packaged_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench.basesets import load_base_set
from refusalbench.tasks.refusalbench.plan.estimate import plan_run

ROOT = Path(__file__).resolve().parents[2]
PAPER_MODELS = ["claude-4-sonnet", "deepseek-r1", "gpt-4o", "nova-pro"]  # generators = verifiers (§3.4, App. E)
FRONTIER = {
    "gpt-4o",
    "gpt-4.1",
    "o4-mini",
    "claude-4-opus",
    "claude-4-sonnet",
    "claude-3.5-sonnet",
    "deepseek-r1",
    "nova-pro",
    "nova-premier",
}  # §4.1: the frontier models evaluated


@pytest.mark.parametrize("name", ["paper-nq.yaml", "paper-garage.yaml"])
def test_paper_config_validates_offline(name):
    # The base set is made later by `data import`: loading the config does not need it.
    cfg = load_config(packaged_config(name))
    gen, ev = cfg.generation, cfg.evaluation
    assert gen.generators == PAPER_MODELS and gen.verifiers == PAPER_MODELS
    assert gen.filter == "unanimous" and gen.base_sample == 100
    assert set(gen.pretest.models) == FRONTIER and gen.pretest.judge == "claude-4-sonnet"
    assert ev.judge == "claude-4-sonnet" and ev.confidence
    assert len(ev.targets) >= 30 and len(set(ev.targets)) == len(ev.targets)
    assert FRONTIER <= set(ev.targets)
    assert cfg.skip_unavailable
    assert all(m in cfg.models for m in cfg.used_models())


def test_nq_is_balanced_by_generator_and_garage_keeps_the_natural_imbalance():
    nq, garage = (load_config(packaged_config(n)).generation for n in ("paper-nq.yaml", "paper-garage.yaml"))
    assert nq.target_size == 1600 and nq.balance == "generator"  # 4 generators x 400
    assert garage.target_size is None and garage.balance == "natural"  # the paper's run kept 1,506
    assert garage.base_sample_by == "domain" and nq.base_sample_by is None  # GaRAGe: 20 per domain (App. C.1)


def test_pretest_and_balance_default_to_todays_behaviour():
    gen = GenerationConfig(base_set="b.jsonl", generators=["g"], verifiers=["v"])
    assert gen.pretest is None and gen.balance == "natural" and gen.base_sample_by is None


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_balance_and_pretest_are_checked(tmp_path):
    registry = """
        models:
          g: {model: openai/g}
        generation:
          base_set: b.jsonl
          generators: [g]
          verifiers: [g]
        """
    bad_balance = _write(tmp_path / "a.yaml", registry + "  balance: evenly\n")
    with pytest.raises(InputError) as info:
        load_config(bad_balance)
    assert "generation.balance" in str(info.value) and ":7:" in str(info.value)
    unknown = _write(tmp_path / "b.yaml", registry + "  pretest: {models: [g, nobody], judge: g}\n")
    with pytest.raises(InputError) as info:
        load_config(unknown)
    assert "generation.pretest.models: model 'nobody' is not in the registry" in str(info.value)
    no_judge = _write(tmp_path / "c.yaml", registry + "  pretest: {models: [g]}\n")
    with pytest.raises(InputError, match="generation.pretest.judge: required key missing"):
        load_config(no_judge)


@pytest.mark.parametrize(
    ("name", "stand_in"), [("paper-nq.yaml", "sample_single.jsonl"), ("paper-garage.yaml", "sample_multi.jsonl")]
)
def test_paper_config_can_be_planned(tmp_path, name, stand_in):
    # The bundled samples stand in for the imported base sets.
    config = _write(
        tmp_path / "run.yaml",
        f"""
        include: {packaged_config(name)}
        generation:
          base_set: {ROOT / "data" / stand_in}
        """,
    )
    cfg = load_config(config)
    items = min(100, len(load_base_set(ROOT / "data" / stand_in)))
    plan = plan_run(cfg)
    # confidence: true -> the calibration pass (App. F.2) asks the targets again; DESIGN §4 names the
    # stages, so its calls count in respond (twice the benchmark) and judge
    assert list(plan.stages) == ["pretest", "generate", "verify", "respond", "judge"]
    assert plan.stages["generate"].calls == items * 18 * 4
    assert plan.stages["generate"].by_model == {m: items * 18 for m in PAPER_MODELS}
    respond = plan.stages["respond"]
    assert len(respond.by_model) == len(cfg.evaluation.targets)
    per_target = min(1600, items * 18 * 4) if name == "paper-nq.yaml" else items * 18 * 4
    assert set(respond.by_model.values()) == {2 * per_target} and "calibration pass" in respond.note
    # the open-weight models have no price: the total says unknown, not zero
    assert plan.total.cost_usd is None and plan.total.priced_cost_usd > 0
    assert "qwen1.5-7b-chat" in plan.total.unpriced_models


def test_policybench_config_is_the_papers_knowornot_run_over_four_bases(tmp_path):
    cfg = load_config(packaged_config("paper-policybench.yaml"))
    kon = cfg.knowornot
    assert [kb.name for kb in kon.knowledge_bases] == ["btt", "cpf", "ica", "medishield"]
    assert kon.retrieval == ["long_context", "hyde_rag"] and kon.evaluator == "gpt-4.1" and kon.label_sample == 200
    assert all(m in cfg.models for m in kon.targets + [kon.evaluator]) and cfg.skip_unavailable
    # Where the released files are beside the checkout, the run's input check accepts all four bases.
    policybench = ROOT.parent / "shared" / "reference" / "policybench"
    if not policybench.is_dir():
        pytest.skip("PolicyBench is not beside the checkout (../shared/reference/policybench)")
    import os
    import shutil

    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs

    shutil.copytree(policybench, tmp_path / "data" / "policybench")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        check_knowornot_inputs(cfg)
    finally:
        os.chdir(here)
