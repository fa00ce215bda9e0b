"""Extending RefusalBench: the registries a plugin adds to, in one import.

A plugin is a Python module that registers what it brings when it is imported, e.g.::

    # acme_rb.py
    from refusalbench.extend import MetricSpec, ProviderProfile, declare, register_provider

    @register_provider("acme")                  # models "acme/<name>" get this profile
    class Acme(ProviderProfile):
        key_env = ("ACME_API_KEY",)
        direct_http = True                      # speaks OpenAI's chat-completions format

        def rewrite_params(self, params):
            out = dict(params)
            if "max_tokens" in out:
                out["max_completion_tokens"] = out.pop("max_tokens")
            return out

    # A ratio of sufficient statistics (ALL_STATISTICS): in metrics.json with intervals and breakdowns.
    declare(MetricSpec("answerable_refusal_share", label="Refused (answerable)",
                       numerator=("answerable_refused",), denominator=("n",), higher_is_better=False))

RefusalBench loads it in every process that reads the config or runs a task (the CLI, thread
workers, Dask worker processes, a flow run a Prefect worker starts) when it is named in one of
two ways:

- **packaged**: the distribution declares an entry point in the group ``refusalbench.plugins``::

      [project.entry-points."refusalbench.plugins"]
      acme = "acme_rb"                  # a module: imported
      acme-metrics = "acme_rb:register" # a function: imported and called with no arguments

  Every installed entry point of the group is loaded.
- **unpackaged**: the run config lists the module under ``plugins:`` (``plugins: [acme_rb]``). It is
  imported from ``sys.path`` first, else from the folder of the config file that lists it.

Both are loaded before the config is validated, so the config may name what a plugin registers (a
model ``acme/big-1``, a retrieval strategy, an embedder, a cache backend). Loading is idempotent (once
per process), and a plugin that cannot be loaded stops the command with one line (exit 2) naming the
config file, line and ``plugins`` key, or the distribution and entry point.

Every registry refuses a name registered twice unless ``replace=True`` (a plugin replacing a
built-in says so). What each kind of extension is (see the docstrings of the names below):

==========================  ===========================================================================
provider quirks             ``ProviderProfile`` subclass + ``@register_provider("prefix")`` (``PROVIDERS``)
a metric                    ``declare(MetricSpec(...))`` (a ratio) or ``@formula_metric(name, ...)`` (``METRIC_SPECS``)
a retrieval strategy        a ``Retriever`` class or function + ``@register_retriever("name", ...)``
an embedder                 a factory returning an ``Embedder`` + ``@register_embedder("name")``
a knowledge-base document   a reader ``path -> text`` + ``@register_document_reader(".ext")``
a KnowOrNot evaluation      ``register_eval_spec(EvalSpec(...))``
a call-cache backend        a factory + ``@register_cache_backend("name")``
a generation pre-check      a function + ``@register_precheck("name")``
a base-set file type        a reader + ``@register_base_set_reader(".ext")``
a rule-generator rule       a function + ``@register_rule("lever-id", ...)``
a config check              a function ``cfg -> (key, problem) | [(key, problem), ...] | None`` + ``@CONFIG_CHECKS.register("name")``
==========================  ===========================================================================
"""

from refusalbench.tasks.core.config import CONFIG_CHECKS, ConfigCheck, RunConfig
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.plugins import ENTRY_POINT_GROUP
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.knowornot.document_readers import DOCUMENT_READERS, DocumentReader, register_document_reader
from refusalbench.tasks.knowornot.stages.embeddings import EMBEDDERS, Embedder, register_embedder
from refusalbench.tasks.knowornot.stages.evaluation import EVAL_SPECS, register_eval_spec
from refusalbench.tasks.knowornot.stages.retrieval import (
    RETRIEVERS,
    IndexedKnowledgeBase,
    RetrievalQuery,
    RetrievalStrategy,
    Retriever,
    register_retriever,
)
from refusalbench.tasks.llm.callcache import CACHE_BACKENDS, CacheBackend, CallCache, register_cache_backend
from refusalbench.tasks.llm.providers import PROVIDERS, ProviderProfile, register_provider
from refusalbench.tasks.refusalbench.basesets.readers import READERS as BASE_SET_READERS
from refusalbench.tasks.refusalbench.basesets.readers import register_reader as register_base_set_reader
from refusalbench.tasks.refusalbench.rule_generator.base import RULES, NotApplicable, RuleOutput, register_rule
from refusalbench.tasks.refusalbench.scoring.row_statistics import ALL_STATISTICS
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS, MetricSpec, declare, formula_metric
from refusalbench.tasks.refusalbench.stages.prechecks import PRECHECKS, register_precheck

__all__ = [
    # how plugins are found
    "ENTRY_POINT_GROUP",
    "Registry",
    "RunConfig",
    # model access
    "PROVIDERS",
    "ProviderProfile",
    "register_provider",
    "CACHE_BACKENDS",
    "CacheBackend",
    "CallCache",
    "register_cache_backend",
    # RefusalBench
    "METRIC_SPECS",
    "MetricSpec",
    "ALL_STATISTICS",
    "declare",
    "formula_metric",
    "PRECHECKS",
    "register_precheck",
    "BASE_SET_READERS",
    "register_base_set_reader",
    "RULES",
    "RuleOutput",
    "NotApplicable",
    "register_rule",
    # KnowOrNot
    "RETRIEVERS",
    "Retriever",
    "RetrievalStrategy",
    "RetrievalQuery",
    "IndexedKnowledgeBase",
    "register_retriever",
    "EMBEDDERS",
    "Embedder",
    "register_embedder",
    "DOCUMENT_READERS",
    "DocumentReader",
    "register_document_reader",
    "EVAL_SPECS",
    "EvalSpec",
    "register_eval_spec",
    # checks of a config against the registries
    "CONFIG_CHECKS",
    "ConfigCheck",
]
