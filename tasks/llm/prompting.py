"""Render the Jinja2 prompt templates under ``prompts/`` into chat messages.

Every template ``<role>.j2`` defines two blocks, ``system`` and ``user``; ``render_messages``
turns them into OpenAI-style messages. Untrusted text (contexts, passages, questions, model
replies) only ever enters a template as a *value*: it is never compiled as template source, so
Jinja syntax inside it stays literal. The ``fence`` filter wraps such text in XML-like tags and
defuses anything inside it that could close the tag early or pose as a chat-template token, and
every system prompt tells the model that tagged text is data, not instructions.

A template may emit ``{{ SHARED_END }}`` once in its user block, where the part its calls share
(instructions, the item) ends and the part that differs per call (a target's reply, a candidate)
begins; :func:`render_prompt` removes it and says where it was, so the messages are exactly what
they are without it and prompt caching (``tasks/llm/prompt_cache.py``) can mark the shared prefix.

``template_hash`` / ``all_template_hashes`` give the provenance hashes recorded in manifests.
A method's own words (RefusalBench's refusal codes, their help, the confidence levels) are
template variables its callers pass (``refusalbench/prompt_vocabulary.py``): prompting knows
no method.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.runtime import new_context
from jinja2.sandbox import SandboxedEnvironment

from refusalbench.prompts import TEMPLATE_DIR

TEMPLATES: tuple[str, ...] = (
    "generator_single.j2",
    "generator_multi.j2",
    "generator_single_edit.j2",
    "generator_multi_edit.j2",
    "verifier_single.j2",
    "verifier_multi.j2",
    "target_single.j2",
    "target_multi.j2",
    "judge_single.j2",
    "judge_multi.j2",
    "judge_decision.j2",
    "target_paper.j2",
    "judge_paper.j2",
    "kon_fact_extraction.j2",
    "kon_qa_generation.j2",
    "kon_hyde.j2",
    "kon_ookb_questions.j2",
    "kon_eval_abstention.j2",
    "kon_eval_factuality.j2",
    "kon_system_basic.j2",
    "kon_system_conservative.j2",
    "kon_system_opinion.j2",
)

# KnowOrNot evaluators: the tag the verdict goes in, and the allowed labels with their meaning.
ABSTENTION_TAG = "abstention"
ABSTENTION_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("yes", "the model abstained (it declined, said it does not know, or said the information is not available)"),
    ("no", "the model attempted an answer of any kind"),
)
FACTUALITY_TAG = "factuality"
FACTUALITY_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("tier_1", "equivalent to the expected answer"),
    ("tier_2", "substitutable, with only non-essential differences"),
    ("tier_3", "unacceptable, with a wrong claim or a missing essential element"),
)

# Tag names the templates use as fences. Inside any fenced value, every tag-like occurrence of
# these names is defused, so text in one fence cannot open or close another one either.
FENCE_TAGS: tuple[str, ...] = (
    "context",
    "passage",
    "question",
    "reference_answer",
    "response",
    "model_answer",
    "expected_answer",
    "sentence",
    "document",
    "fact",
    "abstention",
    "factuality",
)

# Chat-template control tokens (ChatML, Llama 3, Gemma): local servers may tokenise these as real
# special tokens, so a passage containing "<|im_start|>system" could open a genuine system turn.
_CONTROL_TOKEN = re.compile(r"<(\|)|(\|)>|<(/?)(start_of_turn|end_of_turn)>", re.IGNORECASE)

_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _tag_pattern(names: Iterable[str]) -> re.Pattern[str]:
    # Longest names first, so a name that prefixes another ("fact", "factuality") cannot shadow it.
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    # "<", optional spaces, optional "/", optional spaces, then the name as a whole word.
    return re.compile(rf"<(\s*/?\s*)(?=(?:{alternatives})\b)", re.IGNORECASE)


@lru_cache(maxsize=64)
def _tag_pattern_cached(names: tuple[str, ...]) -> re.Pattern[str]:
    return _tag_pattern(sorted(set(names)))


def neutralise(text: Any, tags: Iterable[str] = FENCE_TAGS) -> str:
    """Defuse tag-like text for ``tags`` and chat control tokens; everything else is unchanged.

    ``<context`` becomes ``<\\context`` and ``</context`` becomes ``<\\/context``: still readable
    to a model, but no longer the delimiter. Control tokens get a space inside (``< |im_start| >``).
    """
    as_text = str(text)  # a StrictUndefined value raises here, as it should
    if "<" not in as_text and "|>" not in as_text:  # every tag and control token holds one of them: nothing to defuse
        return as_text
    pattern = _tag_pattern_cached(tuple(tags))
    as_text = pattern.sub(lambda m: "<\\" + m.group(1), as_text)

    def _split_token(m: re.Match[str]) -> str:
        if m.group(1):
            return "< |"
        if m.group(2):
            return "| >"
        return f"< {m.group(3)}{m.group(4)} >"

    return _CONTROL_TOKEN.sub(_split_token, as_text)


def _attribute_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    # Attribute values come from code (ids, flags), but quote-proof them anyway.
    return str(value).replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def fence(value: Any, name: str, neutralise_also: Iterable[str] = (), **attributes: Any) -> str:
    """Wrap untrusted ``value`` as ``<name attr="...">\\n...\\n</name>`` with delimiters defused inside.

    ``neutralise_also`` adds tag names (e.g. an evaluator's answer tag) to defuse in the value.
    """
    if not _TAG_NAME.match(name):
        raise ValueError(f"invalid fence name {name!r}")
    text = "" if value is None else str(value)
    inner = neutralise(text, (*FENCE_TAGS, name, *neutralise_also))
    attrs = "".join(f' {key}="{_attribute_value(val)}"' for key, val in attributes.items())
    return f"<{name}{attrs}>\n{inner}\n</{name}>"


# Where a template's shared part ends: NUL bytes, which no item or reply text carries.
SHARED_END = "\x00shared-prefix-end\x00"


@dataclass(frozen=True)
class RenderedPrompt:
    """A template's messages, and how many characters of the last (user) message every call of the
    stage with the same item shares (None: the template marks no shared part)."""

    messages: list[dict[str, str]]
    shared_chars: int | None = None


def _build_environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # Templates are compiled once per process, not stat-ed on every render (a render per call:
        # the stat releases the GIL, and on a busy process getting it back costs the call thread up to
        # the switch interval). A run re-reads them where it records their hashes (all_template_hashes).
        auto_reload=False,
    )
    env.filters["fence"] = fence
    env.filters["neutralise"] = neutralise
    env.globals["SHARED_END"] = SHARED_END
    return env


ENV: SandboxedEnvironment = _build_environment()


@lru_cache(maxsize=256)
def _template_globals(template: Any) -> dict[str, Any]:
    """A template's globals (the environment's and its own) as one plain dict."""
    return dict(template.globals)


def _render_block(template: Any, block: str, variables: dict[str, Any]) -> str:
    render = template.blocks.get(block)
    if render is None:
        return ""
    # ``template.new_context(variables)``'s context, built from the globals as a plain dict: Jinja merges its
    # ChainMap of globals into every context, twice, which cost more than rendering a short block.
    known = _template_globals(template)
    context = new_context(template.environment, template.name, template.blocks, {**known, **variables}, True, known)
    return "".join(render(context)).strip()


def render_messages(template_name: str, **variables: Any) -> list[dict[str, str]]:
    """Render ``template_name``'s system and user blocks into chat messages.

    A missing variable raises ``jinja2.UndefinedError`` (StrictUndefined); the system message is
    omitted when its block renders empty.
    """
    return render_prompt(template_name, **variables).messages


def render_prompt(template_name: str, **variables: Any) -> RenderedPrompt:
    """:func:`render_messages`, and where the template's ``SHARED_END`` was in the user message."""
    template = ENV.get_template(template_name)
    system = _render_block(template, "system", variables)
    user = _render_block(template, "user", variables)
    shared: int | None = None
    if user.count(SHARED_END) == 1:
        shared, user = user.find(SHARED_END), user.replace(SHARED_END, "")
    elif SHARED_END in user:  # a value carried the marker itself: no split, and the value left as it is
        user = _render_block(template, "user", {**variables, "SHARED_END": ""})
    if not user:
        raise ValueError(f"template {template_name} rendered an empty user message")
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    return RenderedPrompt(messages, shared or None)


def template_source(name: str) -> str:
    source, _, _ = ENV.loader.get_source(ENV, name)  # type: ignore[union-attr]
    return source


def template_hash(name: str) -> str:
    """First 12 hex digits of the SHA-256 of the template's source text."""
    return hashlib.sha256(template_source(name).encode("utf-8")).hexdigest()[:12]


def all_template_hashes() -> dict[str, str]:
    """The hash of every template, as a run records them; the compiled templates are dropped, so the run
    renders what it hashed even in a long-lived process where a template changed since an earlier run."""
    if ENV.cache is not None:  # None only with cache_size=0: then nothing compiled is kept
        ENV.cache.clear()
    return {name: template_hash(name) for name in TEMPLATES}
