"""Batch mode (issue 28, item 3): a model's stage sent through the provider's batch API.

On the scripted server, which answers each batch item with the same replies as its synchronous
route: the same run synchronous and in batch mode (verify, respond and judge) gives the same
benchmark and metrics, the batch run's manifests show the batch price and counters, and each
batch-mode model's stage goes out as one batch job. ``plan`` prices batch calls at the batch price
and shows both totals; the budget's forecast follows it.
"""

from __future__ import annotations

import json

import pytest

from refusalbench.tasks.core.config import BATCH_PRICE_SHARE, load_config
from refusalbench.tasks.pipeline.budget_prices import call_ceiling
from refusalbench.tasks.refusalbench.plan.estimate import plan_run, plan_table
from tests.cli.test_bad_input import run_in_process
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, run_config, verifier_reply

PRICE = {"input_per_mtok": 100.0, "output_per_mtok": 200.0}
MAPPED = "openai/gpt-4o-mini"  # LiteLLM's map has its batch price
# verify, respond and judge through the batch API; generation stays synchronous.
BATCH_MODES = {"ver-a": "batch", "answerer": {"respond": "batch"}, "judge": {"judge": "batch"}}


def write_config(tmp_path, url: str, name: str, modes: dict[str, object]):
    """A tiny run: 2 strata of 3 base items, one generator, verifier, target and judge, shards of 2 rows;
    in its own folder ``name-config``, with its own call cache."""
    folder = tmp_path / f"{name}-config"
    folder.mkdir()
    (folder / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = ("gen-a", "ver-a", "answerer", "judge")
    return run_config(
        folder,
        url,
        models,
        """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH]
  shard_size: 2
evaluation:
  targets: [answerer]
  judge: judge
  bootstrap: 20
  shard_size: 2
""",
        per_model={model: {"mode": modes.get(model, "sync")} for model in models},
        params={"max_tokens": 200},
        price=PRICE,
        batch={"poll_interval_s": 0.05},
    )


@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_run_gives_the_synchronous_runs_benchmark_and_metrics_at_the_batch_price(tmp_path, fake_llm, capsys):
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "answerer": lambda req: "It is 1932.",
            "judge": judge_by_reference,
        }
    )
    runs = {}
    for name, modes in (("sync", {}), ("batch", BATCH_MODES)):  # each its own call cache: every call is made
        out = tmp_path / name
        before = len(fake_llm.calls)
        code, _, stderr = run_in_process(
            ["run", "--config", str(write_config(tmp_path, fake_llm.url, name, modes)), "--out", str(out)], capsys
        )
        assert code == 0, stderr
        runs[name] = (out, fake_llm.calls[before:])
    (sync_out, sync_calls), (batch_out, batch_calls) = runs["sync"], runs["batch"]

    # The same benchmark, byte for byte, and the same metrics (all but the time they were written).
    assert (batch_out / "benchmark.parquet").read_bytes() == (sync_out / "benchmark.parquet").read_bytes()
    metrics = [json.loads((out / "metrics.json").read_text()) for out in (sync_out, batch_out)]
    for document in metrics:
        del document["generated_at"]
    assert metrics[0] == metrics[1]

    # The batch-mode stages went out through batch jobs, one per model and stage (shards of 2 rows:
    # several shards, one job), and nothing was sent twice; generation stayed synchronous.
    assert all("batch" not in call for call in sync_calls)
    sent = {(call["model"], bool(call.get("batch"))) for call in batch_calls}
    assert sent == {("gen-a", False), ("ver-a", True), ("answerer", True), ("judge", True)}
    jobs = {}
    for call in batch_calls:
        if call.get("batch"):
            jobs.setdefault(call["model"], set()).add(call["batch"])
    assert {model: len(ids) for model, ids in jobs.items()} == {"ver-a": 1, "answerer": 1, "judge": 1}
    assert sorted(c["fingerprint"] for c in batch_calls) == sorted(c["fingerprint"] for c in sync_calls)

    # The manifests: the same tokens, the batch price (the sync cost times the batch share), batch counters.
    for manifest, batched in (("generation_manifest.json", {"ver-a"}), ("manifest.json", {"answerer", "judge"})):
        sync_costs = json.loads((sync_out / manifest).read_text())["costs"]
        batch_costs = json.loads((batch_out / manifest).read_text())["costs"]
        for model, sync_model in sync_costs["by_model"].items():
            batch_model = batch_costs["by_model"][model]
            assert batch_model["prompt_tokens"] == sync_model["prompt_tokens"] > 0
            assert batch_model["completion_tokens"] == sync_model["completion_tokens"]
            share = BATCH_PRICE_SHARE if model in batched else 1.0
            assert batch_model["cost_usd"] == pytest.approx(sync_model["cost_usd"] * share), model
            assert batch_model.get("batch_calls", 0) == (batch_model["http_calls"] if model in batched else 0), model
            assert batch_model.get("batch_fallbacks", 0) == 0
        saved = sync_costs["total"]["cost_usd"] - batch_costs["total"]["cost_usd"]
        assert saved > 0 and batch_costs["total"]["batch_savings_usd"] == pytest.approx(saved)


# ---------------------------------------------------------------- plan and budget


def plan_config(tmp_path, modes: dict[str, object]):
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = {
        "gen-a": {"model": "openai/gen-a", "api_base": "http://127.0.0.1:9/v1", "price": PRICE},
        "mapped": {"model": MAPPED},
        "judge": {
            "model": "openai/judge",
            "api_base": "http://127.0.0.1:9/v1",
            "price": {**PRICE, "batch_input_per_mtok": 10.0},
        },
    }
    for name, entry in models.items():
        entry.update(params={"max_tokens": 100}, mode=modes.get(name, "sync"))
    config = tmp_path / "plan.yaml"
    config.write_text(
        "models:\n"
        + "".join(f"  {name}: {json.dumps(entry)}\n" for name, entry in models.items())
        + """
generation:
  base_set: base.jsonl
  generators: [gen-a, mapped]
  verifiers: [mapped]
  strata: [P-MissingInfo/LOW]
evaluation:
  targets: [gen-a, mapped]
  judge: judge
"""
    )
    return load_config(config)


def test_plan_prices_batch_calls_at_the_batch_price_and_shows_both_totals(tmp_path):
    import litellm

    synchronous = plan_run(plan_config(tmp_path, {}))
    plan = plan_run(plan_config(tmp_path, {"judge": {"judge": "batch"}, "mapped": "batch"}))
    assert synchronous.total.batch_calls == 0
    assert synchronous.total.batch_cost_usd < synchronous.total.cost_usd == synchronous.total.sync_cost_usd

    judge = plan.stages["judge"].models["judge"]
    assert judge.batch_calls == judge.calls > 0
    # The config's batch input price, half its output price (no batch output price given).
    assert judge.cost_usd == pytest.approx((judge.input_tokens * 10.0 + judge.output_tokens_max * 100.0) / 1e6)
    assert judge.sync_cost_usd == synchronous.stages["judge"].models["judge"].cost_usd
    info = litellm.get_model_info(MAPPED)  # LiteLLM's map's batch price
    verify = plan.stages["verify"].models["mapped"]
    assert verify.cost_usd == pytest.approx(
        verify.input_tokens * info["input_cost_per_token_batches"]
        + verify.output_tokens_max * info["output_cost_per_token_batches"],
        abs=1e-6,
    )
    gen_a = plan.stages["generate"].models["gen-a"]  # sync as configured
    assert gen_a.batch_calls == 0 and gen_a.cost_usd == gen_a.sync_cost_usd == 2 * gen_a.batch_cost_usd

    total = plan.total
    assert total.batch_calls == judge.calls + sum(
        s.models["mapped"].calls for s in plan.stages.values() if "mapped" in s.models
    )
    assert total.sync_cost_usd == pytest.approx(synchronous.total.cost_usd)
    assert total.batch_cost_usd < total.cost_usd < total.sync_cost_usd
    assert total.cost_usd == pytest.approx(sum(s.cost_usd for s in plan.stages.values()))
    # Batch calls wait up to the batch window, not the concurrency bound.
    assert judge.time_bound_s == plan_config(tmp_path, {}).models["judge"].batch.max_wait_s

    data = json.loads(plan.model_dump_json())  # DESIGN §4's keys, with the totals added
    assert {"calls", "by_model"} <= set(data["stages"]["judge"])
    assert {"calls", "cost_usd", "time_bound_s", "sync_cost_usd", "batch_cost_usd", "batch_calls"} <= set(data["total"])
    text = plan_table(plan)
    assert "judge [batch]" in text
    assert f"calls through the batch API): <= ${total.cost_usd:,.2f}" in text
    assert f"cost, all synchronous: <= ${total.sync_cost_usd:,.2f}" in text
    assert f"cost, every model in mode: batch: <= ${total.batch_cost_usd:,.2f}" in text
    plain = plan_table(synchronous)
    assert f"all synchronous (as configured): <= ${synchronous.total.sync_cost_usd:,.2f}" in plain
    assert f"every model in mode: batch: <= ${synchronous.total.batch_cost_usd:,.2f}" in plain

    # The budget's forecast: batch calls at the batch price.
    # The budget's forecast: batch calls at the batch price, plan's prompt tokens in, max_tokens out.
    batch_cfg, sync_cfg = plan_config(tmp_path, {"judge": {"judge": "batch"}}), plan_config(tmp_path, {})
    tokens = judge.input_tokens / judge.calls
    assert call_ceiling(batch_cfg, "judge", "judge", tokens) == pytest.approx(judge.cost_usd / judge.calls)
    assert call_ceiling(batch_cfg, "judge", "judge", tokens) < call_ceiling(sync_cfg, "judge", "judge", tokens)
