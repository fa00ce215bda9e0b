"""``fanout.FirstCalls``: a downstream stage's submission waits for every upstream model's first call.

A real gateway sends to the scripted server over HTTP; the object reads the gateway's own counters.
No Prefect run: the respond step's use of it is covered by the evaluation flow's tests.
"""

from __future__ import annotations

import threading
import time

import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.callcache import open_cache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer
from refusalbench.tasks.pipeline.fanout import FirstCalls


@pytest.fixture()
def gateway(tmp_path):
    with ScriptedLLMServer(responder=lambda request: "an answer") as server:
        models = {name: ModelConfig(model=f"openai/{name}", api_base=server.url) for name in ("t1", "t2")}
        yield Gateway(models, open_cache("sqlite", path=str(tmp_path / "calls.sqlite")))


def _ask(gateway: Gateway, model: str, question: str) -> None:
    [result] = gateway.complete_many([CallSpec(model=model, messages=[{"role": "user", "content": question}])])
    assert result.error is None, result.error


def test_the_wait_ends_once_every_model_has_a_call_and_not_before(gateway):
    _ask(gateway, "t1", "asked before the wait began")  # counted before: it does not count as t1's first call
    first_calls = FirstCalls(gateway, ["t1", "t2", "t1"])
    assert not first_calls.started()

    _ask(gateway, "t1", "t1's first")
    assert not first_calls.started()  # t2 has sent nothing yet

    sender = threading.Timer(0.3, _ask, args=(gateway, "t2", "t2's first"))
    began = time.monotonic()
    sender.start()
    first_calls.wait(lambda: False, timeout_s=10.0)
    waited = time.monotonic() - began
    sender.join()
    assert first_calls.started()
    assert 0.25 <= waited < 5.0  # held until t2's call, then let go well before the timeout


def test_a_finished_task_or_the_timeout_ends_the_wait_without_a_call(gateway):
    first_calls = FirstCalls(gateway, ["t1", "t2"])

    began = time.monotonic()
    first_calls.wait(lambda: True, timeout_s=10.0)  # a task already done (a cached re-run sends nothing)
    assert time.monotonic() - began < 1.0

    began = time.monotonic()
    first_calls.wait(lambda: False, timeout_s=0.3)  # a model held back (rate limit, batch job): go ahead anyway
    assert 0.3 <= time.monotonic() - began < 2.0
    assert not first_calls.started()
