"""AWS Bedrock batch inference: the requests a JSONL file in S3, a model invocation job on it, the results in S3.

LiteLLM's Bedrock batches build AWS's own endpoint from the region and ignore any other address, and
cannot stop a job; so the job is spoken here with boto3 (``bedrock``: CreateModelInvocationJob,
GetModelInvocationJob, StopModelInvocationJob; ``s3``: the input file and the output prefix). boto3
finds credentials, region and endpoints the AWS way (the default chain, ``AWS_REGION``,
``AWS_ENDPOINT_URL_BEDROCK`` / ``AWS_ENDPOINT_URL_S3``); the model's ``params`` may name
``aws_region_name`` and ``aws_profile_name`` as for its synchronous calls through LiteLLM.

Each line is ``{"recordId": request key, "modelInput": InvokeModel body}``, the body LiteLLM's invoke
route builds for the model: for Claude models the Messages API's (``anthropic_version:
bedrock-2023-05-31``), for Amazon Nova models Nova's own (``system``, ``messages``,
``inferenceConfig``; a JSON schema as ``toolConfig``'s ``json_tool_call`` tool, as on the synchronous
route). Each result is read back through the same provider's response transformation, so a batched
reply caches what the synchronous call would. The protocol takes those two families only
(:meth:`BedrockBatchInference.takes`): AWS does not list DeepSeek-R1 among the models of batch
inference, so its calls in ``mode: batch`` (and every other Bedrock model's) are sent synchronously,
and ``plan`` prices them so.
Bedrock writes ``<output prefix><job id>/<input file name>.out``: one line per record, with its
``modelOutput`` (the InvokeModel reply body) or an ``error``.

The model's ``batch.bedrock.s3_uri`` and ``batch.bedrock.role_arn`` say where the files go and which role the job
runs as; a config naming a ``bedrock/`` model in ``mode: batch`` without them is refused at load.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from refusalbench.tasks.core.config import CONFIG_CHECKS, ModelConfig, RunConfig
from refusalbench.tasks.llm.batch_protocol import BatchProtocol, BatchRequest, JobState, failed_result, litellm_body
from refusalbench.tasks.llm.litellm_import import litellm_module

# Bedrock's job statuses as the batch path names them (batch_protocol.FINISHED: nothing more will come).
STATUSES = {
    "Submitted": "validating",
    "Validating": "validating",
    "Scheduled": "in_progress",
    "InProgress": "in_progress",
    "Stopping": "cancelling",
    "Completed": "completed",
    "PartiallyCompleted": "completed",  # some records errored: their lines say so, they go synchronously
    "Failed": "failed",
    "Stopped": "cancelled",
    "Expired": "expired",
}
# Bedrock's 4xx error codes of a look that do not say the job is gone.
PASSING_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})
PREFIX = "bedrock/"
# LiteLLM's invoke providers whose models Bedrock batch inference takes and whose records are written
# here. DeepSeek-R1 is left out: AWS's list of batch inference models does not name it.
BATCHED_PROVIDERS = frozenset({"anthropic", "nova"})


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix ending in ``/`` or empty) of ``s3://bucket/prefix``."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def model_id(model: str) -> str:
    """Bedrock's model id of a LiteLLM model string (``bedrock/invoke/anthropic.claude-...`` -> ``anthropic.claude-...``)."""
    name = model.removeprefix(PREFIX)
    for route in ("invoke/", "converse/"):
        name = name.removeprefix(route)
    return name


def invoke_provider(model: str) -> str | None:
    """LiteLLM's invoke provider of a Bedrock model string (``anthropic``, ``nova``, ``deepseek_r1`` ...)."""
    from litellm.llms.bedrock.base_aws_llm import BaseAWSLLM

    return BaseAWSLLM.get_bedrock_invoke_provider(model_id(model))


class BedrockBatchInference(BatchProtocol):
    """Bedrock's model invocation jobs, for the Claude and Amazon Nova models on Bedrock."""

    takes_only = "Bedrock's batch inference takes Claude and Nova models; AWS does not list DeepSeek-R1"

    def __init__(self, cfg: ModelConfig, request: BatchRequest) -> None:
        super().__init__(cfg, request)
        self.model_id = model_id(cfg.model)
        # The body of Bedrock's InvokeModel, which a batch record carries: LiteLLM's invoke route for the model.
        self.invoke_cfg = cfg.model_copy(update={"model": f"{PREFIX}invoke/{self.model_id}"})
        self.family = invoke_provider(cfg.model)
        self._clients: dict[str, Any] = {}

    @classmethod
    def takes(cls, model: str) -> bool:
        return invoke_provider(model) in BATCHED_PROVIDERS

    def litellm_provider(self, cfg: ModelConfig) -> str:
        return "bedrock"

    def client(self, service: str) -> Any:
        """The boto3 client of ``service`` (``bedrock`` or ``s3``) in the model's region and profile."""
        if service not in self._clients:
            import boto3

            params = self.cfg.params
            session = boto3.session.Session(
                region_name=params.get("aws_region_name") or os.environ.get("AWS_REGION_NAME") or None,
                profile_name=params.get("aws_profile_name"),
            )
            self._clients[service] = session.client(service)
        return self._clients[service]

    async def call(self, service: str, operation: str, **arguments: Any) -> Any:
        """One boto3 call off the event loop (boto3 blocks, making its client too)."""
        return await asyncio.to_thread(lambda: getattr(self.client(service), operation)(**arguments))

    def _body(self, request: BatchRequest) -> tuple[dict[str, Any], bool]:
        return litellm_body(self.invoke_cfg, request)

    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        if not self.takes(self.cfg.model):
            raise ValueError(f"batch records are written for Claude and Nova models only, not {self.model_id}")
        settings = self.cfg.batch.bedrock
        assert settings is not None  # the config check refuses a config without them
        records = [{"recordId": key, "modelInput": self._body(request)[0]} for key, request in lines]
        data = "".join(json.dumps(record) + "\n" for record in records).encode()
        digest = hashlib.sha256(data).hexdigest()[:16]
        name = f"refusalbench-{int(time.time())}-{digest}"  # Bedrock's job names: letters, digits, dashes
        bucket, prefix = split_s3_uri(settings.s3_uri)
        key = f"{prefix}input/{name}.jsonl"
        await self.call("s3", "put_object", Bucket=bucket, Key=key, Body=data, ContentType="application/jsonl")
        job = await self.call(
            "bedrock",
            "create_model_invocation_job",
            jobName=name,
            roleArn=settings.role_arn,
            modelId=self.model_id,
            clientRequestToken=digest,  # a retried create makes no second job
            inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{bucket}/{key}", "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{bucket}/{prefix}output/"}},
            timeoutDurationInHours=max(24, min(168, int(self.cfg.batch.max_wait_s // 3600) + 1)),
        )
        return str(job["jobArn"])

    async def look(self, job_id: str) -> JobState:
        job = await self.call("bedrock", "get_model_invocation_job", jobIdentifier=job_id)
        status = STATUSES.get(str(job.get("status")), "in_progress")
        output = job.get("outputDataConfig", {}).get("s3OutputDataConfig", {}).get("s3Uri")
        # The job's files are under the output prefix, in a folder named by the job's id (the ARN's last part).
        folder = f"{output.rstrip('/')}/{job_id.rsplit('/', 1)[-1]}/" if output else None
        return JobState(status, (folder,) if folder else ())

    async def cancel(self, job_id: str) -> None:
        await self.call("bedrock", "stop_model_invocation_job", jobIdentifier=job_id)

    async def results(self, job: JobState) -> dict[str, dict[str, Any]]:
        replies: dict[str, dict[str, Any]] = {}
        for folder in job.result_files:
            bucket, prefix = split_s3_uri(folder)
            pages = await self.call("s3", "list_objects_v2", Bucket=bucket, Prefix=prefix)
            keys = [o["Key"] for o in pages.get("Contents", []) if o["Key"].endswith(".jsonl.out")]
            for key in keys:  # manifest.json.out (the job's counts) is not a result file
                content = await self.call("s3", "get_object", Bucket=bucket, Key=key)
                text = (await asyncio.to_thread(content["Body"].read)).decode("utf-8")
                for line in text.splitlines():
                    row = json.loads(line) if line.strip() else {}
                    record = row.get("recordId")
                    if not record:
                        continue
                    error = row.get("error")
                    if isinstance(row.get("modelOutput"), dict) and not error:
                        replies[record] = row["modelOutput"]
                    elif isinstance(error, dict):  # read for its wording: a prompt over the window is too_long
                        replies[record] = failed_result(error.get("errorCode"), error.get("errorMessage") or error)
        return replies

    def response(self, request: BatchRequest, body: dict[str, Any]) -> Any:
        import httpx

        json_mode = self._body(request)[1]  # whether the reply's JSON tool is the answer
        model_response = litellm_module().ModelResponse()
        if self.family == "nova":
            from litellm.llms.bedrock.chat.converse_transformation import AmazonConverseConfig

            # Nova's InvokeModel reply is Converse's shape: LiteLLM's Nova invoke route reads it with
            # Converse's transformation, the synchronous Converse route's too.
            response = AmazonConverseConfig()._transform_response(
                model=self.model_id,
                response=httpx.Response(200, json=body),
                model_response=model_response,
                stream=False,
                logging_obj=None,
                optional_params={"json_mode": json_mode},
                api_key=None,
                data={},
                messages=[],
                encoding=None,
            )
        else:
            from litellm.llms.anthropic.chat.transformation import AnthropicConfig

            response = AnthropicConfig().transform_parsed_response(
                completion_response=body,
                raw_response=httpx.Response(200, json=body),
                model_response=model_response,
                json_mode=json_mode,
            )
        response._hidden_params["custom_llm_provider"] = "bedrock"  # priced as Bedrock's model, as the sync reply
        return response

    def unknown_job(self, error: Exception) -> bool:
        answer = getattr(error, "response", None)
        if not isinstance(answer, dict):  # not the service's answer (a network fault): the job is still there
            return super().unknown_job(error)
        status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = answer.get("Error", {}).get("Code")
        return isinstance(status, int) and 400 <= status < 500 and status != 408 and code not in PASSING_CODES


@CONFIG_CHECKS.register("models.bedrock_batch")
def check_bedrock_batch_settings(config: RunConfig) -> tuple[str, str] | None:
    """A ``bedrock/`` model in ``mode: batch`` that its jobs take names their S3 location and role."""
    for name, cfg in config.models.items():
        batched = cfg.mode == "batch" if isinstance(cfg.mode, str) else "batch" in cfg.mode.values()
        if not (batched and cfg.model.startswith(PREFIX) and BedrockBatchInference.takes(cfg.model)):
            continue
        if cfg.batch.bedrock is None:
            return (
                f"models.{name}.mode",
                f"{name} ({cfg.model}) in mode: batch needs batch.bedrock (s3_uri and role_arn: Bedrock "
                "batch inference reads and writes its files in S3 as that IAM role)",
            )
    return None
