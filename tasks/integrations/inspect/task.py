"""RefusalBench as an inspect_ai task (``pip install 'refusalbench[inspect]'``).

    inspect eval refusalbench/refusalbench -T benchmark=runs/demo/benchmark.parquet \\
        -T judge=anthropic/claude-sonnet-4-5 --model anthropic/claude-haiku-4-5
    refusalbench score logs/ --out runs/inspect      # metrics.json + report.html from the logs

(``inspect eval tasks/integrations/inspect/task.py@refusalbench ...`` in a checkout is the same task.)
Each sample is one benchmark item, prompted with the project's target templates; the scorer
reads the reply with the project's refusal parsing and asks the judge (``-T judge=MODEL`` or
``--model-role grader=MODEL``) through inspect's model API, so inspect's providers, retries
and limits apply to both. The Score keeps the whole judgment in its metadata for
``refusalbench score``. The pure helpers live in ``bridge``; this module is the
inspect glue and is only imported by inspect (the ``inspect_ai`` entry point).

Also here: the ``refusalbench/<litellm model>`` model provider (``--model
refusalbench/openai/NAME --model-base-url URL``), which sends calls through the project's own
LiteLLM path. It is there because the project pins ``litellm==1.100.0``, which needs
``openai<3``, while inspect's OpenAI-family providers (``openai/``, ``openai-api/``, vLLM,
Ollama, ...) need ``openai>=3.4``: until LiteLLM is upgraded, OpenAI-compatible endpoints
are reached through this provider; inspect's Anthropic, Google, Mistral, Bedrock ... providers
work as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeGuard, get_args

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    ResponseSchema,
    RetryDecision,
    StopReason,
    get_model,
    modelapi,
)
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, accuracy, metric, scorer, stderr
from inspect_ai.solver import TaskState, generate
from inspect_ai.tool import ToolChoice, ToolInfo
from inspect_ai.util import JSONSchema

from refusalbench.tasks.core.plugins import load_entry_points
from refusalbench.tasks.integrations.inspect import bridge as bridge
from refusalbench.tasks.integrations.inspect.sample_metadata import SCORE_KEY, item_of
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.llm.providers import profile_for
from refusalbench.tasks.llm.reasoning import split_reasoning
from refusalbench.tasks.llm.transport import CallFailed, litellm_completion
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.scoring.specs import all_metrics, metric_spec
from refusalbench.tasks.refusalbench.stages.judge import DecisionMode

BASE_URL_ENV = "REFUSALBENCH_BASE_URL"
API_KEY_ENV = "REFUSALBENCH_API_KEY"
DEFAULT_TIMEOUT_S = 600.0

_STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))


def _is_stop_reason(reason: str) -> TypeGuard[StopReason]:
    return reason in _STOP_REASONS


def _stop_reason(finish_reason: str | None) -> StopReason:
    """LiteLLM's finish reason as inspect's ``StopReason``: ``bridge.stop_reason`` maps it (bridge keeps no
    inspect import), checked here against inspect's names, "unknown" for any it does not know."""
    reason = bridge.stop_reason(finish_reason)
    return reason if _is_stop_reason(reason) else "unknown"


_MESSAGE_TYPES: dict[str, type[ChatMessage]] = {
    "system": ChatMessageSystem,
    "user": ChatMessageUser,
    "assistant": ChatMessageAssistant,
}


def chat_messages(messages: list[dict[str, str]]) -> list[ChatMessage]:
    return [_MESSAGE_TYPES[m["role"]](content=m["content"]) for m in messages]


# ----------------------------------------------------------------- task


@task
def refusalbench(
    benchmark: str,
    judge: str | None = None,
    judge_base_url: str | None = None,
    confidence: bool = False,
    decision: str = "judge",
) -> Task:
    """RefusalBench over a ``benchmark.parquet`` (a local path or s3:// URI).

    Args:
        benchmark: the benchmark file (as ``refusalbench generate`` writes it).
        judge: the judge model (any inspect model); default: the ``grader`` model role.
        judge_base_url: base URL for the judge model, if it needs one.
        confidence: ask targets for a verbal confidence (calibration metrics).
        decision: ``judge`` (the judge classifies answer vs refusal, as ``evaluation.decision``) or
            ``codes`` (the refusal-code parser decides; the judge grades answers only).
    """
    mode = _decision_mode(decision)
    items = read_benchmark(benchmark)
    samples = []
    for item in items:
        fields = bridge.sample_fields(item, confidence)
        samples.append(
            Sample(
                input=chat_messages(fields["messages"]),
                id=fields["id"],
                target=fields["target"],
                metadata=fields["metadata"],
            )
        )
    return Task(
        dataset=MemoryDataset(samples, name=Path(benchmark).stem, location=str(benchmark)),
        solver=generate(),
        scorer=refusalbench_judge(judge=judge, judge_base_url=judge_base_url, confidence=confidence, decision=mode),
        metadata={"refusalbench_prompt_hashes": all_template_hashes()},
    )


# ----------------------------------------------------------------- scorer


def declared_metric(name: str) -> Metric:
    """The declared metric ``name`` (``scoring.metrics``) as an inspect metric of the same name."""

    def build() -> Metric:
        def compute(scores: list[SampleScore]) -> float:
            return bridge.sample_metrics([(s.score.metadata or {}).get(SCORE_KEY) for s in scores], [name])[name]

        return compute

    return metric(name=name)(build)()


# inspect's accuracy of the C/I values and its standard error, then every metric declared
# ``inspect_task=True`` (FRR, MRR, refusal rate), computed from the judgments as ``score`` does.
# The list is read when this module is imported, which inspect_ai does through its own entry point:
# the installed RefusalBench plugins (``refusalbench.plugins`` entry points) are loaded first, so their
# metrics and provider profiles count here too (no run config, hence no ``plugins:`` list, is read).
load_entry_points()
TASK_METRICS: list[Metric] = [
    accuracy(),
    stderr(),
    *(declared_metric(name) for name in all_metrics() if metric_spec(name).inspect_task),
]


def _decision_mode(decision: str) -> DecisionMode:
    """The task argument (a string from the command line) as the decision mode; anything else is refused."""
    if decision == "judge":
        return "judge"
    if decision == "codes":
        return "codes"
    raise ValueError(f"decision must be 'judge' or 'codes', not {decision!r}")


async def _ask_judge(
    judge: str | None, judge_base_url: str | None, request: tuple[list[dict[str, str]], str, dict[str, Any]]
) -> tuple[str, str | None, str | None]:
    """(judge name, reply text, error): a judge call that fails after inspect's retries is
    recorded as a failed judgment (left out of the metrics, as in ``evaluate``), not raised."""
    messages, schema_name, schema = request
    model = get_model(judge, base_url=judge_base_url) if judge else get_model(role="grader", required=True)
    config = GenerateConfig(
        response_schema=ResponseSchema(name=schema_name, json_schema=JSONSchema.model_validate(schema), strict=False)
    )
    try:
        output = await model.generate(chat_messages(messages), config=config)
    except Exception as exc:
        return str(model), None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return str(model), output.completion, output.error


@scorer(metrics=TASK_METRICS)
def refusalbench_judge(
    judge: str | None = None,
    judge_base_url: str | None = None,
    confidence: bool = False,
    decision: DecisionMode = "judge",
) -> Scorer:
    """The project's refusal parsing and judging; C/I per sample, N when left out of the metrics."""

    async def score(state: TaskState, target: Target) -> Score:
        item = item_of(state.metadata)
        response = bridge.response_of(
            item, str(state.model), state.output.completion, confidence, stop_reason=state.output.stop_reason
        )
        request = bridge.judge_request(item, response, decision)
        if request is None:
            judgment = bridge.judgment_of(item, response, decision=decision)
        else:
            name, text, error = await _ask_judge(judge, judge_base_url, request)
            judgment = bridge.judgment_of(item, response, judge or name, text, error, decision)
        return Score(**bridge.score_fields(item, response, judgment))

    return score


# ----------------------------------------------------------------- model provider


class LiteLLMAPI(ModelAPI):
    """``refusalbench/<LiteLLM model string>``: one chat completion per call through the project's
    LiteLLM path (``transport.litellm_completion``); inspect does the retrying.

    Base URL: ``--model-base-url`` (``model_base_url``), else $REFUSALBENCH_BASE_URL (else
    $INSPECT_EVAL_MODEL_BASE_URL); key: $REFUSALBENCH_API_KEY, else the provider's own variable
    as LiteLLM reads it (a keyless OpenAI-compatible server gets a placeholder).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig | None = None,
        **model_args: Any,
    ) -> None:
        base_url = base_url or os.getenv(BASE_URL_ENV) or os.getenv("INSPECT_EVAL_MODEL_BASE_URL")
        # A fresh GenerateConfig per model: a default instance would be shared (and mutable).
        super().__init__(
            model_name,
            base_url=base_url,
            api_key=api_key or os.getenv(API_KEY_ENV),
            api_key_vars=[API_KEY_ENV],
            config=config if config is not None else GenerateConfig(),
        )
        self.model_args = model_args

    async def generate(
        self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        messages = [{"role": m.role, "content": m.text} for m in input]
        kwargs = {
            **bridge.litellm_kwargs(
                self.model_name, config.model_dump(mode="json", exclude_none=True), self.base_url, self.api_key
            ),
            **self.model_args,
        }
        timeout = float(config.attempt_timeout or config.timeout or DEFAULT_TIMEOUT_S)
        reply = await litellm_completion(self.model_name, messages, timeout, kwargs)
        # Reasoning goes apart from the answer (as the gateway splits it), so the scorer reads the answer only.
        answer, reasoning = split_reasoning(
            None if reply.text is None else str(reply.text),
            reply.reasoning,
            profile_for(self.model_name, self.base_url).reasoning,
        )
        content: Any = (
            [ContentReasoning(reasoning=reasoning), ContentText(text=answer or "")] if reasoning else answer or ""
        )
        output = ModelOutput.from_content(
            model=self.model_name, content=content, stop_reason=_stop_reason(reply.finish_reason)
        )
        prompt, completion = reply.prompt_tokens or 0, reply.completion_tokens or 0
        output.usage = ModelUsage(
            input_tokens=prompt,
            output_tokens=completion,
            total_tokens=prompt + completion,
            reasoning_tokens=reply.reasoning_tokens,
            total_cost=reply.cost_usd,
        )
        return output

    def should_retry(self, ex: Exception) -> bool | RetryDecision:
        if not isinstance(ex, CallFailed) or not ex.retriable:
            return False
        if "429" in str(ex) or "RateLimit" in str(ex):
            return RetryDecision.rate_limit(ex.retry_after)
        return RetryDecision.transient(ex.retry_after)

    def connection_key(self) -> str:
        return f"{self.base_url or ''}|{self.model_name}"


@modelapi(name="refusalbench")
def litellm_provider() -> type[ModelAPI]:
    return LiteLLMAPI
