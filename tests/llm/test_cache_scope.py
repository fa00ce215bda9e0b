"""Cache scope per role (forever | round | ttl), --fresh salts, assignment avoiding earlier rounds'
pairs and fingerprint changes (issue 26), on the scripted server without Prefect."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from refusalbench.tasks.core.cache_policy import CachePolicy, fresh_salts, parse_scope
from refusalbench.tasks.core.config import CacheConfig, ModelConfig, RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.cache_scope import CacheScope
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway, request_key
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.rounds.freshness import fingerprint_changes, fingerprint_lines, fingerprint_of
from refusalbench.tasks.refusalbench.schema.records import BaseItem
from refusalbench.tasks.refusalbench.stages.assign import assign_levers

MESSAGES = [{"role": "user", "content": "Is the sky blue?"}]
ROUND_SCOPE = {"generation": "round", "pretest": "round", "targets": "round", "judge": "forever"}


def _gateway(fake_llm, path, scope: CacheScope | None = None) -> Gateway:
    return Gateway({"m": ModelConfig(model="openai/m", api_base=fake_llm.url)}, SQLiteCache(path), scope=scope)


def _ask(gateway: Gateway, role: str = "targets", content: str = "Is the sky blue?"):
    return gateway.complete_many([CallSpec(model="m", messages=[{"role": "user", "content": content}], role=role)])[0]


def test_scopes_parse_to_one_spelling_and_bad_ones_name_the_line(tmp_path):
    assert parse_scope("forever") == "forever" and parse_scope("Round") == "round"
    assert parse_scope({"ttl": "7d"}) == parse_scope("ttl: 7d") == parse_scope("ttl:168h") == "ttl:604800s"
    assert CachePolicy(judge={"ttl": "12h"}).resolved(refresh=True) == {**ROUND_SCOPE, "judge": "ttl:43200s"}
    assert CachePolicy().resolved(refresh=False) == dict.fromkeys(ROUND_SCOPE, "forever")
    config = tmp_path / "c.yaml"
    config.write_text("cache:\n  policy:\n    targets: weekly\n")
    from refusalbench.tasks.core.config import load_config

    with pytest.raises(InputError) as caught:
        load_config(config)
    assert "cache.policy.targets" in str(caught.value) and ":3" in str(caught.value)
    assert fresh_salts(["targets"], {"targets": "abc"}) == {"targets": "abc"}
    with pytest.raises(ValueError, match="unknown role 'target'"):
        fresh_salts(["target"], None)


def test_forever_keys_are_byte_identical_to_the_keys_before_scopes():
    cfg = ModelConfig(model="openai/m", params={"temperature": 0})
    old = hashlib.sha256(
        json.dumps(
            {"v": 1, "model": "openai/m", "messages": MESSAGES, "params": {"temperature": 0}, "schema": None},
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    spec = CallSpec(model="m", messages=MESSAGES, role="judge")
    assert request_key(cfg, MESSAGES, {}, None) == old
    assert CacheScope.of(CacheConfig()).key(cfg, spec) == old  # an ordinary run: everything forever
    assert CacheScope(ROUND_SCOPE, "round-1").key(cfg, spec) == old  # the judge stays forever in a round
    assert CacheScope(ROUND_SCOPE, "round-1").key(cfg, spec.model_copy(update={"role": "targets"})) != old


def test_round_scope_asks_again_in_a_new_round_and_repeats_nothing_in_a_resumed_one(fake_llm, tmp_path):
    fake_llm.responder = lambda req: "answer"
    path = tmp_path / "c.sqlite"
    first = _gateway(fake_llm, path, CacheScope(ROUND_SCOPE, "round-1"))
    assert not _ask(first).cached and not _ask(first, "judge", "Judge it.").cached
    assert len(fake_llm.calls) == 2
    # The round re-run (a new process after a kill: a new gateway on the same cache) repeats nothing.
    resumed = _gateway(fake_llm, path, CacheScope(ROUND_SCOPE, "round-1"))
    assert _ask(resumed).cached and _ask(resumed, "judge", "Judge it.").cached
    assert len(fake_llm.calls) == 2
    assert resumed.scope.role_stats() == {
        "targets": {"calls": 1, "from_earlier_rounds": 0},
        "judge": {"calls": 1, "from_earlier_rounds": 0},
    }
    # The next round asks the target again; the judge (forever) is served from round 1's entry.
    second = _gateway(fake_llm, path, CacheScope(ROUND_SCOPE, "round-2"))
    assert not _ask(second).cached and _ask(second, "judge", "Judge it.").cached
    assert len(fake_llm.calls) == 3
    assert second.scope.role_stats() == {
        "targets": {"calls": 1, "from_earlier_rounds": 0},
        "judge": {"calls": 1, "from_earlier_rounds": 1},
    }


def test_ttl_serves_young_entries_and_asks_again_for_old_ones(fake_llm, tmp_path):
    fake_llm.responder = lambda req: "answer"
    path = tmp_path / "c.sqlite"
    forever = _gateway(fake_llm, path)
    assert not _ask(forever).cached
    key = request_key(forever.models["m"], MESSAGES, {}, None)
    cache = SQLiteCache(path)
    cache.put(key, {**cache.get(key), "created_at": time.time() - 3 * 3600})  # written three hours ago
    assert _ask(_gateway(fake_llm, path, CacheScope({"targets": "ttl:86400s"}))).cached
    assert len(fake_llm.calls) == 1
    fresh_enough = _gateway(fake_llm, path, CacheScope({"targets": "ttl:3600s"}))
    assert not _ask(fresh_enough).cached  # older than an hour: asked again, and the new reply replaces it
    assert len(fake_llm.calls) == 2 and _ask(fresh_enough).cached


def test_fresh_role_ignores_earlier_entries_but_caches_its_own(fake_llm, tmp_path):
    fake_llm.responder = lambda req: "answer"
    path = tmp_path / "c.sqlite"
    plain = _gateway(fake_llm, path)
    _ask(plain), _ask(plain, "judge", "Judge it.")
    fresh = _gateway(fake_llm, path, CacheScope({}, fresh={"targets": "salt-1"}))
    assert not _ask(fresh).cached and _ask(fresh, "judge", "Judge it.").cached
    resumed = _gateway(fake_llm, path, CacheScope({}, fresh={"targets": "salt-1"}))
    assert _ask(resumed).cached
    assert len(fake_llm.calls) == 3


def test_scoped_config_settles_the_policy_and_reuses_the_recorded_salt(tmp_path):
    from refusalbench.tasks.core.provenance import ManifestRecorder
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.pipeline.cache_scoping import scoped_config

    cfg = RunConfig.model_validate({"cache": {"policy": {"judge": "round"}}})
    in_round = scoped_config(cfg, str(tmp_path / "r"), "round-1")
    assert in_round.cache.round == "round-1"
    assert in_round.cache.policy.resolved(refresh=False) == {**ROUND_SCOPE, "judge": "round"}
    ordinary = scoped_config(cfg, str(tmp_path / "run"))  # no round: its run folder is the round
    assert ordinary.cache.policy.targets == "forever" and ordinary.cache.round.startswith("run:")
    fresh = scoped_config(RunConfig(), str(tmp_path / "run"), fresh=["targets"])
    ManifestRecorder(ArtifactStore(tmp_path / "run"), "run", config=fresh).save()
    again = scoped_config(RunConfig(), str(tmp_path / "run"), fresh=["targets", "judge"])
    assert again.cache.fresh["targets"] == fresh.cache.fresh["targets"] and "judge" in again.cache.fresh
    assert scoped_config(RunConfig(), str(tmp_path / "other"), fresh=["targets"]).cache.fresh != fresh.cache.fresh


def _draw(avoid=()):
    items = [BaseItem(id=f"b{i}", question=f"Q{i}?", answers=["a"], context=f"C{i}.") for i in range(4)]
    return assign_levers(items, load_catalogue(), seed=3, strata=[("P-MissingInfo", "LOW")], avoid=avoid)


def test_assignment_avoids_earlier_pairs_while_the_pool_allows():
    first = _draw()
    assert _draw(avoid=set()) == first  # nothing to avoid: the plain cycle
    pairs = {(a.base_id, a.lever_id) for a in first}
    second = _draw(avoid=pairs)
    assert second == _draw(avoid=pairs)  # seeded, deterministic
    assert not pairs & {(a.base_id, a.lever_id) for a in second}
    levers = [lv.id for lv in load_catalogue() if (lv.perturbation_class, lv.intensity) == ("P-MissingInfo", "LOW")]
    every = {(f"b{i}", lever) for i in range(4) for lever in levers}
    assert {(a.base_id, a.lever_id) for a in _draw(avoid=every)} <= every  # exhausted: repeats, still one per item
    assert len(_draw(avoid=every)) == 4


def test_fingerprint_changes_name_the_models_whose_fingerprints_moved():
    assert fingerprint_of("gpt-4o-2024-08-06", "fp_1") == "gpt-4o-2024-08-06 / fp_1"
    assert fingerprint_of(None, "fp_1") == "fp_1" and fingerprint_of(None, None) is None
    before = {"a": ["a / fp_1"], "b": ["b / fp_1"], "c": [], "gone": ["x"]}
    after = {"a": ["a / fp_2"], "b": ["b / fp_1"], "c": ["c / fp_9"], "new": ["y"]}
    changes = fingerprint_changes(before, after)
    assert changes == [{"model": "a", "before": ["a / fp_1"], "after": ["a / fp_2"]}]
    assert fingerprint_lines(changes) == ["a: a / fp_1 -> a / fp_2"]


def test_fresh_names_a_role_or_the_command_is_bad_usage(tmp_path, capsys):
    from tests.cli.test_bad_input import run_in_process

    code, _, err = run_in_process(["run", "--fresh", "target", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "unknown role 'target'" in err and "generation, pretest, targets, judge" in err
    assert not (tmp_path / "out").exists()
