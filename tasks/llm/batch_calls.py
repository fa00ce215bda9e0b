"""The gateway's batch path: a stage's calls to a model in ``mode: batch`` sent through the provider's batch API.

``Gateway.complete_many`` hands the specs whose model is in batch mode for their stage
(``ModelConfig.batch_mode``) to :class:`BatchCalls`; everything else is as for a synchronous call:

- Cache hits are answered at once, prompts too long for the window are not sent, identical
  requests go once. The rest go out as jobs of at most ``batch.max_items`` requests per model.
- The batch API is spoken by the class the model's provider profile names (``batch_protocol``,
  :class:`~batch_protocol.BatchProtocol`: ``openai_batches``, ``anthropic_batches``); a profile
  without one sends the model's calls synchronously (with one warning). Each request line is what
  the synchronous path would send (``Gateway.request``: the same messages, parameters and response
  format by the provider profile; the body LiteLLM would build from them, or the direct path's body).
- Before any polling, each request's job is written to the call cache under ``batch:<request
  key>`` (job id, the protocol's provider, when it was created), so a process that crashed while waiting polls
  the same job when run again and pays nothing twice.
- Polling sleeps on the gateway's event loop (``batch.poll_interval_s``) and holds none of the
  model's concurrency or rate-limit slots: a batch does not count against the synchronous limits.
- Each result is read exactly as a synchronous reply (``transport.litellm_reply`` of the protocol's
  ``response``, or ``json_reply``, then ``Gateway.finish_batch_reply``: the value, outcome retry and
  result as for a synchronous reply: reasoning split, outcomes, tokens), priced at the batch price (the config's ``price`` with ``batch=True``, else
  LiteLLM's ``*_batches`` price, else half), marked ``batch: true``, written to the call cache as
  it is read, and counted: ``batch_calls``, ``batch_savings_usd``.
- A request the batch answered with the provider's "prompt too long" error (in its wording:
  ``context_errors``) is the row's ``too_long`` outcome, as on the synchronous path. A request the batch
  errored otherwise, let expire or cancelled, or that is unanswered after ``batch.max_wait_s`` since its
  job was created, is sent synchronously (``batch_fallbacks``).
- Waiting elsewhere (:func:`wait_elsewhere`, switched on by the pipeline in a deployment's flow-run
  process): a job that its first look finds still running is not polled here; the requests it holds
  fail with :class:`BatchWaiting`, which names the jobs, so the run can stop and come back once they
  end (``pipeline/batch_suspension.py``). Coming back, the ledger names the same jobs: finished, their
  results are read; past their wait, they are cancelled and their requests sent synchronously.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Coroutine
from typing import Any, NamedTuple, Protocol

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.accounting import UsageCounters
from refusalbench.tasks.llm.batch_protocol import FAILED, BatchProtocol, JobState
from refusalbench.tasks.llm.cache_scope import CacheScope
from refusalbench.tasks.llm.callcache import WriteBehind
from refusalbench.tasks.llm.calls import CallResult, CallSpec
from refusalbench.tasks.llm.context_errors import provider_message
from refusalbench.tasks.llm.providers import ProviderProfile
from refusalbench.tasks.llm.transport import Reply, Request, json_reply, litellm_reply, too_long_reply

log = logging.getLogger("refusalbench.batch_calls")

# Where a request's batch job is recorded in the call cache, before its job is polled.
LEDGER_PREFIX = "batch:"
# Reads of a finished job's results that fail in a row before its requests are sent synchronously instead
# (a failing look at a running job is only logged, every RETRIEVE_ATTEMPTS-th: the job is still there).
RETRIEVE_ATTEMPTS = 5
Futures = dict[int, "concurrent.futures.Future[CallResult]"]
# Whether a running job is left to run without this process (``wait_elsewhere``); off: polled here until it ends.
_WAIT_ELSEWHERE = False


def wait_elsewhere(on: bool = True) -> None:
    """Leave running jobs to the provider instead of polling them in this process (``BatchWaiting``)."""
    global _WAIT_ELSEWHERE
    _WAIT_ELSEWHERE = on


class BatchWaiting(Exception):
    """The requests of jobs still running, not waited for in this process: ``jobs`` are their ledger
    entries (job id, provider, model, when created), already in the call cache."""

    def __init__(self, jobs: list[dict[str, Any]]):
        super().__init__(f"waiting for batch job(s) {', '.join(str(job['job']) for job in jobs)}")
        self.jobs = jobs


def raise_outcomes(outcomes: list[Any]) -> None:
    """Raise the first error of ``asyncio.gather(..., return_exceptions=True)``'s ``outcomes`` other
    than waiting; else every job waited for in one :class:`BatchWaiting`."""
    waiting = [job for outcome in outcomes if isinstance(outcome, BatchWaiting) for job in outcome.jobs]
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, BatchWaiting):
            raise outcome
    if waiting:
        raise BatchWaiting(waiting)


class BatchGateway(Protocol):
    """What the batch path uses of the gateway: ``Gateway``'s batch interface (the gateway imports this
    module, so the batch path names what it needs here instead of importing the gateway)."""

    @property
    def models(self) -> dict[str, ModelConfig]: ...

    @property
    def scope(self) -> CacheScope: ...

    @property
    def usage(self) -> UsageCounters: ...

    @property
    def writes(self) -> WriteBehind: ...

    def run_on_loop(self, work: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]: ...

    def profile(self, model: str, cfg: ModelConfig) -> ProviderProfile: ...

    def without_sending(self, spec: CallSpec, cfg: ModelConfig, key: str) -> CallResult | None: ...

    def request(self, spec: CallSpec, cfg: ModelConfig) -> Request: ...

    async def send(self, spec: CallSpec) -> CallResult: ...

    async def finish_batch_reply(
        self, specs: list[CallSpec], key: str, reply: Reply, latency: float
    ) -> list[CallResult]: ...

    def backoff(self, attempt: int, retry_after: float | None) -> float: ...


class Pending(NamedTuple):
    """One request to send in a batch: the specs that ask it (identical keys are sent once) and its line's parts."""

    key: str
    specs: list[tuple[int, CallSpec]]
    request: Request


class BatchCalls:
    """A gateway's batch path (one per gateway); it uses the gateway's batch interface only."""

    def __init__(self, gateway: BatchGateway):
        self.gateway = gateway
        self._unsupported_warned: set[str] = set()

    # ------------------------------------------------------------ the gateway's hook

    def futures(self, specs: list[CallSpec]) -> Futures:
        """{index: future of its CallResult} for the specs of ``specs`` that go in a batch; started here."""
        models = self.gateway.models
        if all(cfg.mode == "sync" for cfg in models.values()):
            return {}
        picked = {i: spec for i, spec in enumerate(specs) if self._batched(spec)}
        if not picked:
            return {}
        futures: Futures = {i: concurrent.futures.Future() for i in picked}
        self.gateway.run_on_loop(self._run(picked, futures))
        return futures

    def _protocol(self, model: str, cfg: ModelConfig) -> type[BatchProtocol] | None:
        return self.gateway.profile(model, cfg).batch_protocol

    def _batched(self, spec: CallSpec) -> bool:
        cfg = self.gateway.models.get(spec.model)
        if cfg is None or cfg.rule_based or not cfg.batch_mode(spec.stage):
            return False
        if (kind := self._protocol(spec.model, cfg)) is not None and kind.takes(cfg.model):
            return True
        if spec.model not in self._unsupported_warned:
            self._unsupported_warned.add(spec.model)
            log.warning(
                "%s: mode batch is not available for %s (its provider profile names no batch protocol that "
                "takes it); its calls are sent synchronously",
                spec.model,
                cfg.model,
            )
        return False

    async def _run(self, picked: dict[int, CallSpec], futures: Futures) -> None:
        try:
            pending = self._answer_without_sending(picked, futures)
            by_model: dict[str, list[Pending]] = {}
            for item in pending.values():
                by_model.setdefault(item.specs[0][1].model, []).append(item)
            models = (self._model_batches(model, items, futures) for model, items in by_model.items())
            raise_outcomes(await asyncio.gather(*models, return_exceptions=True))
        except BaseException as exc:  # never leave the caller waiting: what is unanswered fails
            for fut in futures.values():
                if not fut.done():
                    fut.set_exception(exc)
            raise

    def _answer_without_sending(self, picked: dict[int, CallSpec], futures: Futures) -> dict[str, Pending]:
        """Answer the cache hits and the prompts too long for the window (as the synchronous path
        does); the rest by request key, each key once."""
        gw = self.gateway
        pending: dict[str, Pending] = {}
        for i, spec in picked.items():
            cfg = gw.models[spec.model]
            key = gw.scope.key(cfg, spec)
            if key in pending:
                pending[key].specs.append((i, spec))
            elif (answered := gw.without_sending(spec, cfg, key)) is not None:
                futures[i].set_result(answered)
            else:
                pending[key] = Pending(key, [(i, spec)], gw.request(spec, cfg))
        return pending

    # ------------------------------------------------------------ jobs

    async def _model_batches(self, model: str, items: list[Pending], futures: Futures) -> None:
        """Send one model's requests: poll the jobs the ledger names, create jobs for the rest."""
        gw = self.gateway
        cfg = gw.models[model]
        kind = self._protocol(model, cfg)
        assert kind is not None  # only specs whose profile names a protocol are picked
        protocol = kind(cfg, items[0].request)
        jobs: dict[str, tuple[dict[str, Any], list[Pending]]] = {}
        new: list[Pending] = []
        for item in items:
            entry = gw.writes.get(LEDGER_PREFIX + item.key)
            if entry is not None and entry.get("job"):
                jobs.setdefault(entry["job"], (entry, []))[1].append(item)
            else:
                new.append(item)
        for start in range(0, len(new), cfg.batch.max_items):
            chunk = new[start : start + cfg.batch.max_items]
            try:
                entry = await self._create(model, protocol, chunk)
            except Exception as exc:  # the provider refused the job: every request goes synchronously
                log.warning(
                    "%s: the batch job could not be created (%s: %s); its %d requests are sent synchronously",
                    model,
                    type(exc).__name__,
                    str(exc).splitlines()[0][:300] if str(exc) else "",
                    len(chunk),
                )
                await self._fall_back(chunk, futures)
                continue
            for item in chunk:  # recorded before the first look: a re-run polls this job, never pays twice
                gw.writes.put(LEDGER_PREFIX + item.key, entry)
            await gw.writes.committed()  # one transaction for the job's requests
            jobs[entry["job"]] = (entry, chunk)
        looked = (self._job(model, protocol, entry, chunk, futures) for entry, chunk in jobs.values())
        raise_outcomes(await asyncio.gather(*looked, return_exceptions=True))

    async def _create(self, model: str, protocol: BatchProtocol, items: list[Pending]) -> dict[str, Any]:
        """Create a job for ``items``: its ledger entry (the job's id, provider, model, when it was created)."""
        job_id = await protocol.submit([(item.key, item.request) for item in items])
        entry = {
            "job": job_id,
            "provider": protocol.provider,
            "model": model,
            "created_at": time.time(),
            "requests": len(items),
        }
        log.info("%s: batch job %s created with %d requests", model, job_id, len(items))
        return entry

    async def _job(
        self, model: str, protocol: BatchProtocol, entry: dict[str, Any], items: list[Pending], futures: Futures
    ) -> None:
        """Poll a job until it ends or its wait runs out; answer its requests from the results, the rest synchronously."""
        cfg = protocol.cfg
        deadline = float(entry.get("created_at") or time.time()) + cfg.batch.max_wait_s
        failures, job = 0, None
        while True:
            try:
                job = await protocol.look(entry["job"])
                failures = 0
            except Exception as exc:  # a network or server fault passes: the job is still there, keep looking
                failures += 1
                log.log(
                    logging.WARNING if failures % RETRIEVE_ATTEMPTS == 1 else logging.DEBUG,
                    "%s: looking at batch %s failed (%d in a row): %s",
                    model,
                    entry["job"],
                    failures,
                    exc,
                )
                if protocol.unknown_job(exc):
                    job = None  # the provider does not know the job (deleted, wrong account): nothing will come
                    break
            if job is not None and job.finished:
                break
            if job is not None and _WAIT_ELSEWHERE and time.time() < deadline:
                raise BatchWaiting([entry])  # recorded in the ledger: the run comes back for it
            if time.time() >= deadline:
                log.warning(
                    "%s: batch %s is unfinished after max_wait_s (%g s): cancelled, and what it has not "
                    "answered is sent synchronously",
                    model,
                    entry["job"],
                    cfg.batch.max_wait_s,
                )
                job = await self._cancel(protocol, entry)
                break
            await asyncio.sleep(cfg.batch.poll_interval_s)
        results = await self._read_results(protocol, entry, job) if job is not None else {}
        gw_profile = self.gateway.profile(model, cfg)
        unanswered, answered = [], []
        for item in items:
            body = results.get(item.key)
            if body is None:
                unanswered.append(item)
                continue
            failed = body.get(FAILED)
            if failed is not None:  # answered with an error: a prompt over the window is too_long, as when synchronous
                message = str(failed.get("message") or "")
                if not gw_profile.context_too_long(failed.get("status"), message):
                    unanswered.append(item)
                    continue
                status = failed.get("status")
                reply = too_long_reply(f"HTTP {status or 400}: {provider_message(message)}")
            else:
                try:
                    reply = self._reply(protocol, item, body)
                except Exception as exc:  # a result that does not read as a reply: asked again synchronously
                    log.debug("%s: batch result for %s did not read: %s", model, item.key, exc)
                    unanswered.append(item)
                    continue
            turnaround = time.time() - float(entry.get("created_at") or time.time())  # the batch's latency
            answered.append(self._answered(item, reply, turnaround, futures))
        await asyncio.gather(*answered)  # written together: one transaction for the replies read now
        await self._fall_back(unanswered, futures)

    async def _cancel(self, protocol: BatchProtocol, entry: dict[str, Any]) -> JobState | None:
        """Cancel a job past its wait, so the provider stops working (and billing) on it; the job once
        cancelled, whose answered requests are still read, or None."""
        try:
            await protocol.cancel(entry["job"])
            job = await protocol.look(entry["job"])
        except Exception as exc:  # the provider keeps it: its requests are still sent synchronously
            log.warning("%s: cancelling batch %s failed: %s", entry["model"], entry["job"], exc)
            return None
        return job if job.finished else None

    async def _read_results(
        self, protocol: BatchProtocol, entry: dict[str, Any], job: JobState
    ) -> dict[str, dict[str, Any]]:
        """The job's results (the protocol's), read again after a failure (network, 5xx) a few times
        before its requests are given up to the synchronous path (which would pay for them twice)."""
        for attempt in range(1, RETRIEVE_ATTEMPTS + 1):
            try:
                return await protocol.results(job)
            except Exception as exc:
                log.warning(
                    "%s: reading the results of batch %s failed (%d of %d): %s",
                    entry["model"],
                    entry["job"],
                    attempt,
                    RETRIEVE_ATTEMPTS,
                    exc,
                )
                if attempt < RETRIEVE_ATTEMPTS:
                    await asyncio.sleep(self.gateway.backoff(attempt, None))
        return {}

    # ------------------------------------------------------------ results

    @staticmethod
    def _reply(protocol: BatchProtocol, item: Pending, body: dict[str, Any]) -> Reply:
        """A batch result read as the synchronous path reads the same reply."""
        if item.request.body is not None:
            return json_reply(body)  # the direct path's request: read as the direct path reads it
        return litellm_reply(protocol.response(item.request, body))

    async def _answered(self, item: Pending, reply: Reply, latency: float, futures: Futures) -> None:
        """A batch reply: each spec asking it answered, as the gateway finishes a batch reply."""
        results = await self.gateway.finish_batch_reply([spec for _, spec in item.specs], item.key, reply, latency)
        for (index, _), result in zip(item.specs, results):
            futures[index].set_result(result)

    async def _fall_back(self, items: list[Pending], futures: Futures) -> None:
        """Send what the batch did not answer synchronously, each through the gateway's own path."""
        gw = self.gateway

        async def one(index: int, spec: CallSpec) -> None:
            futures[index].set_result(await gw.send(spec))

        for item in items:
            spec = item.specs[0][1]
            gw.usage.count(spec.model, spec.stage, batch_fallbacks=1)
        await asyncio.gather(*(one(index, spec) for item in items for index, spec in item.specs))
