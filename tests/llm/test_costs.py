"""Costs that add up and a budget that stops a run (issue 28, items 1 and 2), on the scripted server.

The scripted server bills words as tokens; prices come from the models' ``price`` in the config
(over LiteLLM's map) or from LiteLLM's offline map; a model with neither is unpriced.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.scripted_server import Behaviour
from tests.cli.test_bad_input import run_in_process
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, run_config, verifier_reply

MAPPED = "openai/gpt-4o-mini"  # priced by LiteLLM's offline map
USER_PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0, "cached_input_per_mtok": 100.0}


def test_prices_come_from_the_config_over_the_map_unknown_is_null_and_rejected_replies_are_billed(fake_llm):
    fake_llm.behaviours["empty"] = Behaviour(content="")
    fake_llm.behaviours["gpt-4o-mini"] = Behaviour(cached_prompt_tokens=2)
    url = fake_llm.url
    gateway = Gateway(
        {
            "mapped": ModelConfig(model=MAPPED, api_base=url),
            "user": ModelConfig(model=MAPPED, api_base=url, price=USER_PRICE),
            "unpriced": ModelConfig(model="openai/scripted-free", api_base=url),
            "empty": ModelConfig(model="openai/empty", api_base=url, price=USER_PRICE),
        }
    )
    message = [{"role": "user", "content": "one two three four five"}]
    with accounting.stage("respond"):  # distinct prompts: two names of one model would share one request
        mapped, user, unpriced = gateway.complete_many(
            [
                CallSpec(model=m, messages=[{"role": "user", "content": f"{m}: one two three"}])
                for m in ("mapped", "user", "unpriced")
            ]
        )
    (empty,) = gateway.complete_many([CallSpec(model="empty", messages=message, stage="judge")])

    import litellm

    info = litellm.get_model_info(MAPPED)
    output = mapped.completion_tokens * info["output_cost_per_token"]  # LiteLLM's own cost: within the map's bounds
    assert (
        mapped.prompt_tokens * info["cache_read_input_token_cost"] + output
        <= mapped.cost_usd
        <= mapped.prompt_tokens * info["input_cost_per_token"] + output
    )
    # The user's price wins over the map, cached prompt tokens at their own price.
    assert user.cached_tokens == 2
    assert user.cost_usd == pytest.approx(
        ((user.prompt_tokens - 2) * 1000 + 2 * 100 + user.completion_tokens * 2000) / 1e6
    )
    assert unpriced.ok and unpriced.cost_usd is None
    # Empty, asked twice, billed twice: the record carries both replies' tokens and cost.
    assert empty.error_kind == "empty" and len(fake_llm.calls_for("empty")) == 2
    assert empty.prompt_tokens == fake_llm.billed("empty")["prompt_tokens"] > 0
    assert empty.cost_usd == pytest.approx(empty.prompt_tokens * 1000 / 1e6)

    by_stage = gateway.stage_snapshot()
    assert set(by_stage) == {"respond", "judge"} and set(by_stage["judge"]) == {"empty"}
    assert by_stage["respond"]["unpriced"] == {
        "http_calls": 1,
        "prompt_tokens": unpriced.prompt_tokens,
        "completion_tokens": unpriced.completion_tokens,
        "unpriced_calls": 1,
    }
    costs = accounting.cost_summary(by_stage)
    assert costs["total"]["cost_usd"] is None and costs["total"]["unpriced_calls"] == 1  # never a silent $0
    assert costs["by_model"]["unpriced"]["cost_usd"] is None
    assert costs["by_model"]["user"]["cost_usd"] == pytest.approx(user.cost_usd)
    assert costs["total"]["priced_cost_usd"] == pytest.approx(mapped.cost_usd + user.cost_usd + empty.cost_usd)
    assert costs["total"]["http_calls"] == len(fake_llm.calls) == 5
    assert costs["total"]["cached_tokens"] == 2 * 2  # mapped and user, each 2


def test_plan_uses_the_user_price_and_leaves_unknown_prices_null(tmp_path):
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.refusalbench.plan.estimate import plan_run

    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    priced = {"params": {"max_tokens": 100}, "price": USER_PRICE}
    models = {
        "gen-a": {"model": "openai/gen-a", "api_base": "http://127.0.0.1:9/v1", **priced},
        "mapped": {"model": MAPPED, **priced},
        "ver-a": {"model": "openai/ver-a", "api_base": "http://127.0.0.1:9/v1"},
    }
    config = tmp_path / "plan.yaml"
    config.write_text(
        "models:\n"
        + "".join(f"  {name}: {json.dumps(entry)}\n" for name, entry in models.items())
        + """
generation:
  base_set: base.jsonl
  generators: [gen-a, mapped]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW]
"""
    )
    plan = plan_run(load_config(config))
    gen = plan.stages["generate"].models
    for name in ("gen-a", "mapped"):  # the config's price, not the map's, for a mapped model too
        assert gen[name].cost_usd == pytest.approx(
            (gen[name].input_tokens * 1000 + gen[name].calls * 100 * 2000) / 1e6, rel=1e-6
        )
    assert plan.stages["verify"].models["ver-a"].cost_usd is None  # unknown: null, not $0
    assert plan.total.cost_usd is None and plan.total.unpriced_models == ["ver-a"]


# ---------------------------------------------------------------- a run with a budget

CHEAP = {"input_per_mtok": 0.01, "output_per_mtok": 0.01}
DEAR = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}


def write_run_config(tmp_path, url, budget: float):
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    prices = {"gen-a": CHEAP, "ver-a": DEAR, "answerer": DEAR, "judge": None}  # the judge is unpriced
    return run_config(
        tmp_path,
        url,
        prices,
        f"budget_usd: {budget}\nbudget_unpriced: free\n"  # the judge's calls count as $0
        + """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH]
evaluation:
  targets: [answerer]
  judge: judge
  bootstrap: 20
  shard_size: 2
""",
        per_model={name: {"price": price} for name, price in prices.items() if price},
        params={"max_tokens": 200},
    )


def budget_artifact():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        (latest,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["budget-spend"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    return latest


def records_cost(frame: pd.DataFrame, prefix: str = "") -> tuple[float, int, int]:
    """(cost, prompt tokens, completion tokens) of the rows whose call was made in this run."""
    made = frame[~frame[f"{prefix}cached"].astype(bool)] if len(frame) else frame
    return (
        float(made[f"{prefix}cost_usd"].fillna(0).sum()),
        int(made[f"{prefix}prompt_tokens"].fillna(0).sum()),
        int(made[f"{prefix}completion_tokens"].fillna(0).sum()),
    )


@pytest.mark.usefixtures("prefect_harness")
def test_a_budget_stops_the_run_and_a_larger_one_finishes_it_with_costs_that_add_up(tmp_path, fake_llm, capsys):
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "answerer": lambda req: "It is 1932.",
            "judge": judge_by_reference,
        }
    )
    out = tmp_path / "run"
    # Generating costs fractions of a cent; one verify shard at least 6 x 200 tokens at $1000/Mtok.
    config = write_run_config(tmp_path, fake_llm.url, 0.05)
    code, _, stderr = run_in_process(["run", "--config", str(config), "--out", str(out)], capsys)
    assert code == 1, stderr
    (line,) = [text for text in stderr.splitlines() if text.startswith("error")]
    assert line.startswith("error: budget_usd: spent $") and "of $0.05" in line and "stage verify" in line, line
    first = list(fake_llm.calls)
    assert {call["model"] for call in first} == {"gen-a"}  # stopped before the first verify shard
    stopped = json.loads((out / "manifest.json").read_text())
    assert stopped["status"] == "failed" and stopped["costs"]["total"]["http_calls"] == len(first)
    assert any("budget_usd: spent" in note for note in stopped["notes"])
    spend = budget_artifact()  # the Prefect UI's spend against the budget
    assert spend.type == "progress" and 0 < float(spend.data) < 100 and "of the $0.05 budget" in spend.description

    write_run_config(tmp_path, fake_llm.url, 1000)
    code, _, stderr = run_in_process(["run", "--config", str(config), "--out", str(out)], capsys)
    assert code == 0, stderr
    # No call repeated: what the first run sent came from the caches.
    assert Counter(call["fingerprint"] for call in fake_llm.calls).most_common(1)[0][1] == 1
    assert {c["model"] for c in fake_llm.calls[len(first) :]} == {"ver-a", "answerer", "judge"}
    generated = json.loads((out / "generation_manifest.json").read_text())
    evaluated = json.loads((out / "manifest.json").read_text())

    # Every manifest counts its own calls: together exactly the calls the server counted.
    manifests = (stopped, generated, evaluated)
    assert sum(m["costs"]["total"]["http_calls"] for m in manifests) == len(fake_llm.calls)
    for manifest in manifests:  # total = sum of the stages = sum of the models
        costs = manifest["costs"]
        for name in ("http_calls", "prompt_tokens", "completion_tokens", "unpriced_calls"):
            assert (
                costs["total"][name]
                == sum(s[name] for s in costs["by_stage"].values())
                == sum(m[name] for m in costs["by_model"].values())
            ), name
        assert costs["total"]["priced_cost_usd"] == pytest.approx(
            sum(s["priced_cost_usd"] for s in costs["by_stage"].values())
        )
    for manifest, model in ((stopped, "gen-a"), (generated, "ver-a")):
        billed = fake_llm.billed(model)
        assert manifest["costs"]["by_model"][model]["prompt_tokens"] == billed["prompt_tokens"]
        assert manifest["costs"]["by_model"][model]["completion_tokens"] == billed["completion_tokens"]
    eval_costs = evaluated["costs"]
    assert set(eval_costs["by_stage"]["respond"]["by_model"]) == {"answerer"}  # overlapping stages, each its own
    assert set(eval_costs["by_stage"]["judge"]["by_model"]) == {"judge"}
    assert eval_costs["by_model"]["judge"]["cost_usd"] is None  # unpriced: null and counted, never $0
    assert eval_costs["by_model"]["judge"]["unpriced_calls"] == len(fake_llm.calls_for("judge")) > 0
    assert eval_costs["total"]["cost_usd"] is None and eval_costs["budget_usd"] == 1000

    # The per-call records add up to the manifests' totals (each call in the run that made it).
    for manifest, files in (
        (stopped, [("candidates", "")]),
        (generated, [("verifications", "")]),
        (evaluated, [("responses", ""), ("judgments", "judge_")]),
    ):
        sums = [records_cost(pd.read_parquet(out / f"{name}.parquet"), prefix) for name, prefix in files]
        cost, prompt, completion = (sum(parts) for parts in zip(*sums))
        total = manifest["costs"]["total"]
        assert total["priced_cost_usd"] == pytest.approx(cost) and cost > 0
        assert (total["prompt_tokens"], total["completion_tokens"]) == (prompt, completion)
