"""The gateway's batch path: a stage's calls to a model in ``mode: batch`` sent through the provider's batch API.

``Gateway.complete_many`` hands the specs whose model is in batch mode for their stage
(``ModelConfig.batch_mode``) to :class:`BatchCalls`; everything else is as for a synchronous call:

- Cache hits are answered at once, prompts too long for the window are not sent, identical
  requests go once. The rest go out as jobs of at most ``batch.max_items`` requests per model.
- Each request line is what the synchronous path would send (``Gateway._request``: the same
  messages, parameters and response format by the provider profile; the body LiteLLM would build
  from them, by LiteLLM's own provider transformation, or the direct path's body as posted).
- OpenAI-compatible providers go through LiteLLM's files + batches API (``acreate_file``,
  ``acreate_batch``, ``aretrieve_batch``, ``afile_content``). Anthropic: LiteLLM 1.100.0 retrieves
  a message batch and reads its results, but cannot create one (its ``AnthropicBatchesConfig``
  raises NotImplementedError), so the create is one direct POST to ``/v1/messages/batches`` with
  LiteLLM's own URL and headers for it; retrieval and results go through LiteLLM.
- Before any polling, each request's job is written to the call cache under ``batch:<request
  key>`` (job id, provider, when it was created), so a process that crashed while waiting polls
  the same job when run again and pays nothing twice.
- Polling sleeps on the gateway's event loop (``batch.poll_interval_s``) and holds none of the
  model's concurrency or rate-limit slots: a batch does not count against the synchronous limits.
- Each result is read exactly as a synchronous reply (``transport.litellm_reply`` /
  ``json_reply``, then the gateway's ``_value``, outcome retry and ``_finish``: reasoning split,
  outcomes, tokens), priced at the batch price (the config's ``price`` with ``batch=True``, else
  LiteLLM's ``*_batches`` price, else half), marked ``batch: true``, written to the call cache as
  it is read, and counted: ``batch_calls``, ``batch_savings_usd``.
- A request the batch errored, let expire or cancelled, or that is unanswered after
  ``batch.max_wait_s`` since its job was created, is sent synchronously (``batch_fallbacks``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from typing import Any, NamedTuple

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.calls import CallResult, CallSpec
from refusalbench.tasks.llm.providers import provider_prefix
from refusalbench.tasks.llm.reply_outcomes import TOO_LONG, cacheable
from refusalbench.tasks.llm.transport import Reply, Request, json_reply, litellm_module, litellm_reply

log = logging.getLogger("refusalbench.batch_calls")

# The providers whose batch API this path speaks: OpenAI's files + batches (and servers speaking it), Anthropic's.
OPENAI_STYLE = frozenset({"openai", "hosted_vllm", "litellm_proxy"})
ANTHROPIC = "anthropic"
# Where a request's batch job is recorded in the call cache, before its job is polled.
LEDGER_PREFIX = "batch:"
# Batch statuses (LiteLLM gives Anthropic's ``ended`` as ``completed``) after which nothing more will come.
FINISHED = frozenset({"completed", "expired", "failed", "cancelled"})
# Reads of a finished job's results that fail in a row before its requests are sent synchronously instead
# (a failing look at a running job is only logged, every RETRIEVE_ATTEMPTS-th: the job is still there).
RETRIEVE_ATTEMPTS = 5


class Pending(NamedTuple):
    """One request to send in a batch: the specs that ask it (identical keys are sent once) and its line's parts."""

    key: str
    specs: list[tuple[int, CallSpec]]
    request: Request


class BatchCalls:
    """A gateway's batch path (one per gateway)."""

    def __init__(self, gateway: Any):  # the Gateway (not imported: it imports this module)
        self.gateway = gateway
        self._unsupported_warned: set[str] = set()

    # ------------------------------------------------------------ the gateway's hook

    def futures(self, specs: list[CallSpec]) -> dict[int, concurrent.futures.Future]:
        """{index: future of its CallResult} for the specs of ``specs`` that go in a batch; started here."""
        models = self.gateway.models
        if all(cfg.mode == "sync" for cfg in models.values()):
            return {}
        picked = {i: spec for i, spec in enumerate(specs) if self._batched(spec)}
        if not picked:
            return {}
        futures = {i: concurrent.futures.Future() for i in picked}
        self.gateway._loop.submit(self._run(picked, futures))
        return futures

    def _batched(self, spec: CallSpec) -> bool:
        cfg = self.gateway.models.get(spec.model)
        if cfg is None or cfg.rule_based or not cfg.batch_mode(spec.stage):
            return False
        provider = provider_prefix(cfg.model)
        if provider in OPENAI_STYLE or provider == ANTHROPIC:
            return True
        if spec.model not in self._unsupported_warned:
            self._unsupported_warned.add(spec.model)
            log.warning("%s: mode batch is not available for provider %r (openai-style and anthropic are); its calls "
                        "are sent synchronously", spec.model, provider)
        return False

    async def _run(self, picked: dict[int, CallSpec], futures: dict[int, concurrent.futures.Future]) -> None:
        try:
            pending = self._answer_without_sending(picked, futures)
            by_model: dict[str, list[Pending]] = {}
            for item in pending.values():
                by_model.setdefault(item.specs[0][1].model, []).append(item)
            await asyncio.gather(*(self._model_batches(model, items, futures) for model, items in by_model.items()))
        except BaseException as exc:  # never leave the caller waiting: what is unanswered fails
            for fut in futures.values():
                if not fut.done():
                    fut.set_exception(exc)
            raise

    def _answer_without_sending(self, picked: dict[int, CallSpec],
                                futures: dict[int, concurrent.futures.Future]) -> dict[str, Pending]:
        """Answer the cache hits and the prompts too long for the window (as the synchronous path
        does); the rest by request key, each key once."""
        gw = self.gateway
        pending: dict[str, Pending] = {}
        for i, spec in picked.items():
            cfg = gw.models[spec.model]
            key = gw.scope.key(cfg, spec)
            if key in pending:
                pending[key].specs.append((i, spec))
                continue
            cached = gw.scope.cached_reply(gw._writes, key, spec, cfg, gw.models)
            if cached is not None:
                gw._count(spec.model, spec.stage, cache_hits=1)
                futures[i].set_result(gw._finish(spec, key, cached, cached=True, attempts=0))
                continue
            too_long = gw._too_long(spec, cfg)
            if too_long is not None:
                gw._count(spec.model, **{TOO_LONG: 1})
                futures[i].set_result(CallResult(model=spec.model, key=key, tag=spec.tag, error=too_long,
                                                 error_kind=TOO_LONG))
                continue
            request = gw._request(spec, cfg, gw._structured_mode(spec, cfg))
            pending[key] = Pending(key, [(i, spec)], request)
        return pending

    # ------------------------------------------------------------ jobs

    async def _model_batches(self, model: str, items: list[Pending],
                             futures: dict[int, concurrent.futures.Future]) -> None:
        """Send one model's requests: poll the jobs the ledger names, create jobs for the rest."""
        gw = self.gateway
        cfg = gw.models[model]
        jobs: dict[str, tuple[dict[str, Any], list[Pending]]] = {}
        new: list[Pending] = []
        for item in items:
            entry = gw._writes.get(LEDGER_PREFIX + item.key)
            if entry is not None and entry.get("job"):
                jobs.setdefault(entry["job"], (entry, []))[1].append(item)
            else:
                new.append(item)
        for start in range(0, len(new), cfg.batch.max_items):
            chunk = new[start:start + cfg.batch.max_items]
            try:
                entry = await self._create(model, cfg, chunk)
            except Exception as exc:  # the provider refused the job: every request goes synchronously
                log.warning("%s: the batch job could not be created (%s: %s); its %d requests are sent synchronously",
                            model, type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "", len(chunk))
                await self._fall_back(chunk, futures)
                continue
            for item in chunk:  # recorded before the first look: a re-run polls this job, never pays twice
                gw._writes.put(LEDGER_PREFIX + item.key, entry)
            await gw._writes.committed()  # one transaction for the job's requests
            jobs[entry["job"]] = (entry, chunk)
        await asyncio.gather(*(self._job(model, cfg, entry, chunk, futures) for entry, chunk in jobs.values()))

    async def _create(self, model: str, cfg: ModelConfig, items: list[Pending]) -> dict[str, Any]:
        """Create a job for ``items``: its ledger entry (the job's id, provider, model, when it was created)."""
        litellm = litellm_module()
        provider = provider_prefix(cfg.model) or "openai"
        request = items[0].request
        if provider == ANTHROPIC:
            lines = [{"custom_id": item.key, "params": self._litellm_body(cfg, item.request)[0]} for item in items]
            job_id = (await self._post_anthropic(request, cfg, "", {"requests": lines}))["id"]
        else:
            body = "".join(json.dumps(self._openai_line(cfg, item)) + "\n" for item in items).encode()
            auth = {"custom_llm_provider": provider, "api_base": request.api_base, "api_key": request.api_key}
            upload = await litellm.acreate_file(file=("batch.jsonl", body, "application/jsonl"), purpose="batch",
                                                **auth)
            job = await litellm.acreate_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                              input_file_id=upload.id, **auth)
            job_id = job.id
        entry = {"job": job_id, "provider": provider, "model": model, "created_at": time.time(), "requests": len(items)}
        log.info("%s: batch job %s created with %d requests", model, job_id, len(items))
        return entry

    def _openai_line(self, cfg: ModelConfig, item: Pending) -> dict[str, Any]:
        """The JSONL line of an OpenAI-style batch: the direct path's body as posted, or the body LiteLLM would send."""
        request = item.request
        if request.body is not None:
            body = request.body
        else:
            body = self._litellm_body(cfg, request)[0]
            body.update(body.pop("extra_body", None) or {})  # the OpenAI SDK merges extra_body into the body
            body.pop("stream", None)
        return {"custom_id": item.key, "method": "POST", "url": "/v1/chat/completions", "body": body}

    @staticmethod
    def _litellm_body(cfg: ModelConfig, request: Request) -> tuple[dict[str, Any], bool]:
        """The body LiteLLM's provider adapter makes of this request, as ``acompletion`` would (its own
        parameter mapping and request transformation), and whether it answers in its JSON tool."""
        litellm = litellm_module()
        from litellm.types.utils import LlmProviders
        from litellm.utils import ProviderConfigManager, get_optional_params

        name, provider, _, _ = litellm.get_llm_provider(cfg.model)
        params = {k: v for k, v in request.kwargs.items() if k not in ("api_base", "api_key", "extra_headers")}
        optional = get_optional_params(model=name, custom_llm_provider=provider, **params)
        json_mode = bool(optional.pop("json_mode", False))
        config = ProviderConfigManager.get_provider_chat_config(model=name, provider=LlmProviders(provider))
        body = config.transform_request(model=name, messages=request.messages, optional_params=optional,
                                        litellm_params={}, headers={})
        return dict(body), json_mode

    async def _post_anthropic(self, request: Request, cfg: ModelConfig, path: str, payload: dict[str, Any] | None
                              ) -> dict[str, Any]:
        """POST to the message batches endpoint (+ ``path``): LiteLLM can neither create nor cancel an
        Anthropic batch, so these two requests are made here, with LiteLLM's URL and headers for them."""
        import aiohttp
        from litellm.llms.anthropic.batches.transformation import AnthropicBatchesConfig
        from litellm.llms.anthropic.common_utils import AnthropicModelInfo

        config = AnthropicBatchesConfig()
        api_key = request.api_key or AnthropicModelInfo.get_api_key()
        url = config.get_complete_batch_url(request.api_base, api_key, cfg.model, {}, {}, {}) + path  # type: ignore[arg-type]
        headers = config.validate_environment({**cfg.extra_headers}, cfg.model, [], {}, {}, api_key, request.api_base)
        timeout = aiohttp.ClientTimeout(total=max(cfg.timeout_s, 60))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            data = json.dumps(payload) if payload is not None else None
            async with session.post(url, data=data, headers=headers) as answer:
                raw = await answer.text()
                if answer.status >= 400:
                    raise RuntimeError(f"HTTP {answer.status}: {raw[:300]}")
        return json.loads(raw)

    async def _job(self, model: str, cfg: ModelConfig, entry: dict[str, Any], items: list[Pending],
                   futures: dict[int, concurrent.futures.Future]) -> None:
        """Poll a job until it ends or its wait runs out; answer its requests from the results, the rest synchronously."""
        litellm = litellm_module()
        request = items[0].request
        auth = {"custom_llm_provider": entry["provider"], "api_base": request.api_base, "api_key": request.api_key}
        deadline = float(entry.get("created_at") or time.time()) + cfg.batch.max_wait_s
        failures, job = 0, None
        while True:
            try:
                # LiteLLM's logging would otherwise download the results after every look to price them.
                job = await litellm.aretrieve_batch(batch_id=entry["job"], **auth,
                                                    litellm_metadata={"batch_ignore_default_logging": True})
                failures = 0
            except Exception as exc:  # a network or server fault passes: the job is still there, keep looking
                failures += 1
                status = getattr(exc, "status_code", None)
                log.log(logging.WARNING if failures % RETRIEVE_ATTEMPTS == 1 else logging.DEBUG,
                        "%s: looking at batch %s failed (%d in a row): %s", model, entry["job"], failures, exc)
                if isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 429):
                    job = None  # the provider does not know the job (deleted, wrong account): nothing will come
                    break
            if job is not None and job.status in FINISHED:
                break
            if time.time() >= deadline:
                log.warning("%s: batch %s is unfinished after max_wait_s (%g s): cancelled, and what it has not "
                            "answered is sent synchronously", model, entry["job"], cfg.batch.max_wait_s)
                job = await self._cancel(cfg, entry, request, auth)
                break
            await asyncio.sleep(cfg.batch.poll_interval_s)
        results = await self._read_results(entry, job, auth) if job is not None else {}
        unanswered, answered = [], []
        for item in items:
            body = results.get(item.key)
            if body is None:
                unanswered.append(item)
                continue
            try:
                reply = self._reply(cfg, entry["provider"], item, body)
            except Exception as exc:  # a result that does not read as a reply: asked again synchronously
                log.debug("%s: batch result for %s did not read: %s", model, item.key, exc)
                unanswered.append(item)
                continue
            turnaround = time.time() - float(entry.get("created_at") or time.time())  # the batch's latency
            answered.append(self._answered(cfg, item, reply, turnaround, futures))
        await asyncio.gather(*answered)  # written together: one transaction for the replies read now
        await self._fall_back(unanswered, futures)

    async def _cancel(self, cfg: ModelConfig, entry: dict[str, Any], request: Request, auth: dict[str, Any]) -> Any:
        """Cancel a job past its wait, so the provider stops working (and billing) on it; the job once
        cancelled, whose answered requests are still read, or None."""
        litellm = litellm_module()
        try:
            if entry["provider"] == ANTHROPIC:
                await self._post_anthropic(request, cfg, f"/{entry['job']}/cancel", None)
            else:
                await litellm.acancel_batch(batch_id=entry["job"], **auth)
            job = await litellm.aretrieve_batch(batch_id=entry["job"], **auth,
                                                litellm_metadata={"batch_ignore_default_logging": True})
        except Exception as exc:  # the provider keeps it: its requests are still sent synchronously
            log.warning("%s: cancelling batch %s failed: %s", entry["model"], entry["job"], exc)
            return None
        return job if job.status in FINISHED else None

    async def _read_results(self, entry: dict[str, Any], job: Any, auth: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The job's results (:meth:`_results`), read again after a failure (network, 5xx) a few times
        before its requests are given up to the synchronous path (which would pay for them twice)."""
        for attempt in range(1, RETRIEVE_ATTEMPTS + 1):
            try:
                return await self._results(entry, job, auth)
            except Exception as exc:
                log.warning("%s: reading the results of batch %s failed (%d of %d): %s", entry["model"], entry["job"],
                            attempt, RETRIEVE_ATTEMPTS, exc)
                if attempt < RETRIEVE_ATTEMPTS:
                    await asyncio.sleep(self.gateway._backoff(attempt, None))
        return {}

    async def _results(self, entry: dict[str, Any], job: Any, auth: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """{custom_id: the reply body} of a finished job's succeeded requests."""
        litellm = litellm_module()
        files = [job.output_file_id] if entry["provider"] == ANTHROPIC else [job.output_file_id, job.error_file_id]
        replies: dict[str, dict[str, Any]] = {}
        for file_id in filter(None, files):
            content = await litellm.afile_content(file_id=file_id, **auth)
            for line in content.content.decode("utf-8").splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if entry["provider"] == ANTHROPIC:
                    result = row.get("result") or {}
                    if result.get("type") == "succeeded":
                        replies[row["custom_id"]] = result["message"]
                else:
                    response = row.get("response") or {}
                    if response.get("status_code") == 200 and isinstance(response.get("body"), dict):
                        replies[row["custom_id"]] = response["body"]
        return replies

    # ------------------------------------------------------------ results

    def _reply(self, cfg: ModelConfig, provider: str, item: Pending, body: dict[str, Any]) -> Reply:
        """A batch result read as the synchronous path reads the same reply."""
        if item.request.body is not None:
            return json_reply(body)  # the direct path's request: read as the direct path reads it
        litellm = litellm_module()
        if provider == ANTHROPIC:
            import httpx
            from litellm.llms.anthropic.chat.transformation import AnthropicConfig

            json_mode = self._litellm_body(cfg, item.request)[1]  # whether the reply's JSON tool is the answer
            response = AnthropicConfig().transform_parsed_response(
                completion_response=body, raw_response=httpx.Response(200, json=body),
                model_response=litellm.ModelResponse(), json_mode=json_mode)
            return litellm_reply(response)
        from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import \
            convert_to_model_response_object

        return litellm_reply(convert_to_model_response_object(response_object=body,
                                                              model_response_object=litellm.ModelResponse()))

    async def _answered(self, cfg: ModelConfig, item: Pending, reply: Reply, latency: float,
                        futures: dict[int, concurrent.futures.Future]) -> None:
        """A batch reply: valued at the batch price, asked again (synchronously) when its outcome is
        worth it as a synchronous reply's is, cached, and each spec asking it answered."""
        gw = self.gateway
        first_index, spec = item.specs[0]
        gw._count(spec.model, spec.stage, http_calls=1)
        value = gw._value(spec, cfg, reply, latency, batch=True)
        value, attempts, _ = await gw._send_for_outcome(spec, cfg, first=(value, 1, None))
        if cacheable(value, structured=spec.schema_ is not None):
            gw._writes.put(item.key, gw.scope.stamped(value))
        await gw._writes.committed()  # in the call cache before its result is handed back
        for n, (index, each) in enumerate(item.specs):
            if n:
                gw._count(each.model, deduplicated=1)
            futures[index].set_result(gw._finish(each, item.key, value, cached=False, attempts=attempts))

    async def _fall_back(self, items: list[Pending], futures: dict[int, concurrent.futures.Future]) -> None:
        """Send what the batch did not answer synchronously, each through the gateway's own path."""
        gw = self.gateway

        async def one(index: int, spec: CallSpec) -> None:
            futures[index].set_result(await gw._complete(spec))

        for item in items:
            spec = item.specs[0][1]
            gw._count(spec.model, spec.stage, batch_fallbacks=1)
        await asyncio.gather(*(one(index, spec) for item in items for index, spec in item.specs))
