"""What a provider's batch API is to the gateway's batch path: one :class:`BatchProtocol` class per API.

A provider profile names the class of its batch API (``ProviderProfile.batch_protocol``; None:
the provider has none, and its models in ``mode: batch`` are sent synchronously). The batch path
(``batch_calls``) does what every batch API shares: answering from the cache first, the job
ledger in the call cache, polling until the job ends or its wait runs out, cancelling a late job,
reading each result as the synchronous reply it stands for, pricing it, sending what the job did
not answer synchronously. What differs between APIs is the protocol's: the request lines, how
they are uploaded and the job created, how the job is looked at and cancelled, where its results
are and how one reads, and which errors say the provider does not know the job.

This module imports nothing of the provider profiles (they import it), so a protocol holds wire
code only; the profiles decide which models speak it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from refusalbench.tasks.core.config import BATCH_PRICE_SHARE, ModelConfig
from refusalbench.tasks.llm.litellm_import import litellm_module

# Batch statuses (LiteLLM gives Anthropic's ``ended`` as ``completed``) after which nothing more will come.
FINISHED = frozenset({"completed", "expired", "failed", "cancelled"})
# 4xx statuses of a look at a job that do not say the job is gone: timeout, conflict, rate limit.
PASSING_4XX = frozenset({408, 409, 429})
# The key of a result the job answered with an error (:func:`failed_result`); no reply body has it.
FAILED = "batch_failed"


def failed_result(status: int | None, error: Any) -> dict[str, Any]:
    """A request's result when the job answered it with an error: the HTTP status where the API gives
    one, and the provider's error body (as JSON text, read for its wording)."""
    return {FAILED: {"status": status, "message": error if isinstance(error, str) else json.dumps(error)}}


class BatchRequest(Protocol):
    """What a protocol reads of one request: the synchronous attempt's (``transport.Request`` has these)."""

    @property
    def api_base(self) -> str | None: ...

    @property
    def api_key(self) -> str | None: ...

    @property
    def body(self) -> dict[str, Any] | None:
        """The direct path's body, posted as is; None: the request goes through LiteLLM."""

    @property
    def messages(self) -> list[dict[str, Any]]: ...

    @property
    def kwargs(self) -> dict[str, Any]:
        """LiteLLM's parameters: sampling, endpoint, key, headers, response format."""


@dataclass(frozen=True)
class JobState:
    """A job as one look found it: its status (``FINISHED`` once nothing more will come) and the
    files its results are read from (the protocol's own ids)."""

    status: str
    result_files: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class BatchProtocol(ABC):
    """One provider batch API, spoken for one model (an instance per model and batch run).

    A new batch API (Bedrock batch inference, Vertex AI batch prediction, ...) is one subclass
    plus the ``batch_protocol`` attribute of the profiles whose models use it. It implements:

    - :meth:`submit`: write one line per request (each what the synchronous path would send:
      ``request.body`` as posted on the direct path, else the body LiteLLM would make of
      ``request.messages`` and ``request.kwargs``, :func:`litellm_body`), upload them where the API
      takes a file, create the job; return the job's id. Raising sends every request synchronously.
    - :meth:`look`: the job's :class:`JobState` now. Raising is a failed look: the batch path
      looks again, unless :meth:`unknown_job` says the provider does not know the job.
    - :meth:`cancel`: ask the provider to stop a job past its wait (the batch path then looks once
      more and reads what it did answer).
    - :meth:`results`: ``{custom id: reply body}`` of the requests a finished job answered; a request
      the job answered with an error is :func:`failed_result` of the provider's status and error
      body (the batch path reads a prompt too long for the window as ``too_long``, as the synchronous
      path does, and sends the rest synchronously); the ones it did not answer (expired, cancelled)
      are left out and sent synchronously.
    - :meth:`response`: one reply body of a request sent through LiteLLM, read as LiteLLM reads the
      provider's synchronous reply (a ``litellm.ModelResponse``). A direct-path request's body is
      OpenAI's chat completion and is read by the batch path itself.

    It may set :attr:`price_share` (the batch price as a share of the synchronous one, where
    neither the config nor LiteLLM's map has a batch price) and override :meth:`litellm_provider`
    and :meth:`takes` (the API takes some of the provider's models only; :attr:`takes_only` then
    says which, for ``plan``'s note on the models sent synchronously).
    ``self.provider`` is written with the job into the call cache's ledger.
    """

    # The batch price against the synchronous one, where neither the config nor LiteLLM's map says
    # (``plan``'s estimate; the accounting of a reply bills core.config.BATCH_PRICE_SHARE, the same half).
    price_share: ClassVar[float] = BATCH_PRICE_SHARE
    takes_only: ClassVar[str | None] = None  # which models :meth:`takes`, where not all of the provider's

    def __init__(self, cfg: ModelConfig, request: BatchRequest) -> None:
        self.cfg = cfg
        self.api_base = request.api_base  # every request of one model goes to one endpoint with one key
        self.api_key = request.api_key
        self.provider = self.litellm_provider(cfg)

    @classmethod
    def takes(cls, model: str) -> bool:
        """Whether the API takes requests to ``model`` (a LiteLLM model string); a model it does not take
        is sent synchronously, and ``plan`` prices it so."""
        return True

    def litellm_provider(self, cfg: ModelConfig) -> str:
        """LiteLLM's name of the provider the model's jobs go to (its ``custom_llm_provider``)."""
        return str(litellm_module().get_llm_provider(cfg.model)[1])

    @abstractmethod
    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        """Create a job answering each ``(custom id, request)``; its id."""

    @abstractmethod
    async def look(self, job_id: str) -> JobState:
        """The job's state now."""

    @abstractmethod
    async def cancel(self, job_id: str) -> None:
        """Ask the provider to stop the job."""

    @abstractmethod
    async def results(self, job: JobState) -> dict[str, dict[str, Any]]:
        """{custom id: reply body} of the requests a finished job answered."""

    @abstractmethod
    def response(self, request: BatchRequest, body: dict[str, Any]) -> Any:
        """A reply body of a request sent through LiteLLM, as LiteLLM's ``ModelResponse``."""

    def unknown_job(self, error: Exception) -> bool:
        """Whether a failed look says the provider does not know the job (deleted, another account):
        then nothing will come of it. A network fault or 5xx passes: the job is still there."""
        status = getattr(error, "status_code", None)
        return isinstance(status, int) and 400 <= status < 500 and status not in PASSING_4XX


class LiteLLMBatches(BatchProtocol, ABC):
    """A batch API LiteLLM retrieves (``aretrieve_batch``) and whose result files it reads (``afile_content``)."""

    def auth(self) -> dict[str, Any]:
        """LiteLLM's arguments naming the provider, endpoint and key of the model's jobs."""
        return {"custom_llm_provider": self.provider, "api_base": self.api_base, "api_key": self.api_key}

    def result_files(self, job: Any) -> tuple[str, ...]:
        """The files of LiteLLM's batch object ``job`` holding its results (output and errors)."""
        return tuple(filter(None, (job.output_file_id, job.error_file_id)))

    async def look(self, job_id: str) -> JobState:
        # LiteLLM's logging would otherwise download the results after every look to price them.
        job = await litellm_module().aretrieve_batch(
            batch_id=job_id, **self.auth(), litellm_metadata={"batch_ignore_default_logging": True}
        )
        return JobState(str(job.status), self.result_files(job))

    async def results(self, job: JobState) -> dict[str, dict[str, Any]]:
        replies: dict[str, dict[str, Any]] = {}
        for file_id in job.result_files:
            content = await litellm_module().afile_content(file_id=file_id, **self.auth())
            for line in content.content.decode("utf-8").splitlines():
                if line.strip():
                    self.read_line(json.loads(line), replies)
        return replies

    @abstractmethod
    def read_line(self, row: dict[str, Any], replies: dict[str, dict[str, Any]]) -> None:
        """Add one line of a result file to ``replies`` ({custom id: reply body}) if its request succeeded."""


def litellm_body(cfg: ModelConfig, request: BatchRequest) -> tuple[dict[str, Any], bool]:
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
    if config is None:
        raise ValueError(f"LiteLLM has no chat transformation for provider {provider!r}")
    body = config.transform_request(
        model=name,
        messages=[dict(m) for m in request.messages],  # type: ignore[misc]  # LiteLLM pops the system message
        optional_params=optional,
        litellm_params={},
        headers={},
    )
    return dict(body), json_mode
