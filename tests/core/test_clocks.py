"""The clocks of ``core/clocks.py`` and the default shard sizes of the fan-out (no Prefect run: fast)."""

from __future__ import annotations

import threading
from pathlib import Path

from refusalbench.tasks.core import clocks
from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.pipeline.fanout import ROUNDS_PER_SHARD, TASKS_PER_MODEL, Fanout


def test_clocks_count_under_their_scope_in_each_thread():
    start = clocks.snapshot()
    with clocks.clock_scope("score"), clocks.timed("unit_clock"):
        pass

    def other_thread() -> None:  # a new thread starts with no scope of its own
        with clocks.timed("unit_clock"):
            pass

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    counted = clocks.since(start)
    assert counted["score/unit_clock"]["n"] == 1 and counted["unit_clock"]["n"] == 1
    assert counted["score/unit_clock"]["wall_s"] >= 0 and counted["score/unit_clock"]["cpu_s"] >= 0
    assert "score/unit_clock" not in clocks.since(clocks.snapshot())  # nothing counted since


def _config(tmp_path: Path, shard_size: str = "") -> Path:
    models = "".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: http://127.0.0.1:9/v1\n    max_concurrency: 16\n"
        for n in ("t1", "t2", "judge")
    )
    path = tmp_path / "c.yaml"
    path.write_text(
        f"models:\n{models}evaluation:\n  targets: [t1, t2]\n  judge: judge\n{shard_size}", encoding="utf-8"
    )
    return path


def test_default_shards_follow_the_models_not_the_items(tmp_path):
    cfg = load_config(_config(tmp_path))
    fanout = Fanout(cfg, str(tmp_path / "run"))
    default = cfg.evaluation.shard_size
    # Few items: the section's default (or a shard that keeps 16 slots busy for several rounds).
    assert fanout.shard_size(cfg.evaluation, 10, ["t1", "judge"]) == max(default, ROUNDS_PER_SHARD * 16)
    # Many items: at most TASKS_PER_MODEL shards per model, however many items there are.
    for rows in (720, 10_000, 100_000):
        size = fanout.shard_size(cfg.evaluation, rows, ["t1", "judge"])
        assert -(-rows // size) <= TASKS_PER_MODEL
    assert fanout._shard_size >= -(-100_000 // TASKS_PER_MODEL)  # the budget's estimate of an unwritten shard
    # Between one and TASKS_PER_MODEL full shards: the rows split evenly, with no small remainder shard.
    assert fanout.shard_size(cfg.evaluation, 180, ["t1", "judge"]) == 180  # one shard, not 128 + 52
    assert fanout.shard_size(cfg.evaluation, 300, ["t1", "judge"]) == 150  # two of 150, not 128 + 128 + 44


def test_a_configured_shard_size_is_kept(tmp_path):
    cfg = load_config(_config(tmp_path, "  shard_size: 4\n"))
    assert Fanout(cfg, str(tmp_path / "run")).shard_size(cfg.evaluation, 10_000, ["t1"]) == 4
