"""A changed lever (catalogue) or template re-sends exactly the affected calls, nothing else."""

from __future__ import annotations

import json

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.schema.records import BaseItem
from refusalbench.tasks.refusalbench.stages.assign import assign_levers
from refusalbench.tasks.refusalbench.stages.generate import generate_candidates
from tests.scripted import generator_reply


def _setup(fake_llm, tmp_path):
    fake_llm.responder = lambda req: generator_reply(req, "x")
    gateway = Gateway(
        {"gen": ModelConfig(model="openai/gen", api_base=fake_llm.url)}, SQLiteCache(tmp_path / "c.sqlite")
    )
    items = [BaseItem(id=f"b{i}", question=f"Question {i}?", answers=["a"], context=f"Context {i}.") for i in range(3)]
    levers = [lv for lv in load_catalogue() if lv.perturbation_class == "P-MissingInfo" and lv.intensity != "MEDIUM"]
    assignments = assign_levers(items, levers, seed=1, strata=[("P-MissingInfo", "LOW"), ("P-MissingInfo", "HIGH")])
    return gateway, {i.id: i for i in items}, levers, assignments


def test_changed_lever_invalidates_only_its_calls(fake_llm, tmp_path):
    gateway, items, levers, assignments = _setup(fake_llm, tmp_path)
    by_id = {lv.id: lv for lv in levers}
    generate_candidates(gateway, assignments, items, by_id, "gen")
    assert len(fake_llm.calls) == len(assignments) == 6

    # Edit one assigned lever's instruction: only the assignments using it are sent again.
    edited = assignments[0].lever_id
    by_id[edited] = by_id[edited].model_copy(update={"instruction": by_id[edited].instruction + " Be brief."})
    again = generate_candidates(gateway, assignments, items, by_id, "gen")
    uses = sum(a.lever_id == edited for a in assignments)
    assert len(fake_llm.calls) == 6 + uses
    assert sum(not c.cached for c in again) == uses


def test_changed_template_invalidates_the_calls_rendered_with_it(fake_llm, tmp_path, monkeypatch):
    import refusalbench.tasks.refusalbench.stages.generate as generate

    gateway, items, levers, assignments = _setup(fake_llm, tmp_path)
    by_id = {lv.id: lv for lv in levers}
    generate_candidates(gateway, assignments, items, by_id, "gen")
    sent = len(fake_llm.calls)
    # Same messages: nothing is sent.
    generate_candidates(gateway, assignments, items, by_id, "gen")
    assert len(fake_llm.calls) == sent
    # A template whose rendering differs (simulated by a changed system text) re-sends every call it renders.
    original = generate.generation_messages
    monkeypatch.setattr(
        generate,
        "generation_messages",
        lambda item, lever: [
            {**m, "content": m["content"] + " v2"} if m["role"] == "system" else m for m in original(item, lever)
        ],
    )
    generate_candidates(gateway, assignments, items, by_id, "gen")
    assert len(fake_llm.calls) == sent + len(assignments)
    assert json.dumps(fake_llm.calls[-1]["messages"]).count(" v2") == 1


def test_stage_task_cache_key_follows_the_typed_config():
    """Stage tasks take the typed RunConfig: equal configs share a cache key, a changed
    setting gets a new one, and the run-time endpoints (api_bases) never count."""
    from prefect.cache_policies import Inputs

    from refusalbench.tasks.core.config import RunConfig
    from refusalbench.tasks.pipeline.refusalbench.shard_tasks import respond_shard

    (inputs_policy,) = [p for p in respond_shard.cache_policy.policies if isinstance(p, Inputs)]

    def key(cfg: RunConfig, api_bases: dict[str, str]) -> str:
        inputs = {
            "config": cfg,
            "run_root": "run",
            "target": "m",
            "items_name": "_work/items-0000.parquet",
            "content_hash": "h",
            "api_bases": api_bases,
        }
        return inputs_policy.compute_key(None, inputs, {})

    raw = {"models": {"m": {"model": "openai/m"}}, "evaluation": {"targets": ["m"], "judge": "m"}}
    first, second = RunConfig.model_validate(raw), RunConfig.model_validate(raw)
    second.source = "/elsewhere/config.yaml"  # where the config was read from is not part of it
    assert key(first, {"m": "http://127.0.0.1:1/v1"}) == key(second, {"m": "http://127.0.0.1:2/v1"})
    changed = RunConfig.model_validate({**raw, "evaluation": {**raw["evaluation"], "confidence": True}})
    assert key(changed, {}) != key(first, {})
