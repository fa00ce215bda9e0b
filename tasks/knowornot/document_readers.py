"""Reading knowledge-base documents into plain-text blocks, one reader per file type.

A reader turns one file into text whose blocks (heading, paragraph, list item, table row)
are separated by a blank line, so that sentence splitting (``sentences.split_sentences``)
never glues a heading to the sentence after it. Readers are registered by file extension
in ``DOCUMENT_READERS`` (``@register_document_reader(".ext")``); a folder contributes the
files of every registered type.

- ``.txt``: hard-wrapped lines joined, paragraphs kept. ``.md`` / ``.markdown``: markup removed.
- ``.pdf``: the text layer, read with pypdf (pure Python, maintained; no system library).
  Pages are blocks, and a short capitalised line standing between two sentences (a heading)
  is a block of its own. An encrypted PDF is opened only when its user password is empty;
  a PDF without a text layer (a scan) is an error naming OCR as the way out.
- ``.html`` / ``.htm``: the standard library's ``html.parser`` (tolerant of unclosed tags, no
  dependency; BeautifulSoup would run this same parser underneath). Scripts, styles, the
  ``<head>``, navigation, footers and forms are dropped; block elements end a block; table
  cells are joined with ``; `` as Markdown tables are.

Every text file is read through ``core.textinput``: bytes that are not UTF-8 are an
``InputError`` naming line and column, like any other input of the project.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path
from typing import TypeVar

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.core.textinput import read_bytes, read_text
from refusalbench.tasks.knowornot.schema.records import SourceDocument

DocumentReader = Callable[[Path], str]
R = TypeVar("R", bound=DocumentReader)

DOCUMENT_READERS: Registry[DocumentReader] = Registry("document type")

_BLANK_LINES = re.compile(r"\n\s*\n")
_WHITESPACE = re.compile(r"\s+")


def register_document_reader(suffix: str, *, replace: bool = False) -> Callable[[R], R]:
    """Decorator: read files ending in ``suffix`` (``".pdf"``, lower case) with the decorated
    function, ``path -> text`` in blank-line-separated blocks (InputError for what it cannot read)."""
    return DOCUMENT_READERS.register(suffix, replace=replace)


# ----------------------------------------------------------------- text and Markdown

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


def _document_text(path: Path) -> str:
    """A text document's content (``read_text``); an empty one is an InputError."""
    text = read_text(path)
    if not text.strip():
        raise InputError(str(path), "document is empty")
    return text


@register_document_reader(".txt")
def read_plain_text(path: Path) -> str:
    """A plain-text file: hard-wrapped lines joined, paragraphs kept."""
    return plain_text_blocks(_document_text(path))


@register_document_reader(".markdown")
@register_document_reader(".md")
def read_markdown(path: Path) -> str:
    """A Markdown file as prose (``markdown_to_text``)."""
    return markdown_to_text(_document_text(path))


# ----------------------------------------------------------------- PDF

_SENTENCE_END = re.compile(r"[.!?:;][\"')\]]*$")
_PAGE_NUMBER = re.compile(r"^(?:page\s+)?\d{1,3}(?:\s*(?:/|of)\s*\d{1,3})?$", re.I)  # "7", "Page 7 of 12"
_HEADING_MAX_WORDS = 8


def _starts_upper(line: str) -> bool:
    return line[:1].isupper() or line[:1].isdigit()


def pdf_page_blocks(page_text: str) -> list[str]:
    """The blocks of one page's extracted text: wrapped lines joined, page numbers dropped, and a
    heading (a short line without end punctuation, between a sentence end and a capitalised line)
    kept apart from the paragraph it introduces."""
    lines = [line.strip() for line in page_text.splitlines()]
    lines = [line for line in lines if line and not _PAGE_NUMBER.match(line)]
    blocks: list[list[str]] = [[]]
    for i, line in enumerate(lines):
        after_sentence = i == 0 or bool(_SENTENCE_END.search(lines[i - 1]))
        next_upper = i + 1 < len(lines) and _starts_upper(lines[i + 1])
        heading = (
            after_sentence
            and next_upper
            and _starts_upper(line)
            and not _SENTENCE_END.search(line)
            and len(line.split()) <= _HEADING_MAX_WORDS
        )
        if heading:
            blocks += [[line], []]
        else:
            blocks[-1].append(line)
    return [" ".join(block) for block in blocks if block]


@register_document_reader(".pdf")
def read_pdf(path: Path) -> str:
    """A PDF's text layer, page by page (pypdf). Encrypted (with a password), damaged and
    image-only PDFs are InputErrors that say so."""
    from pypdf import PasswordType, PdfReader

    file = str(path)
    raw = read_bytes(path)
    if not raw.strip():
        raise InputError(file, "document is empty")
    # pypdf logs each repair of a damaged file as a warning; what it cannot repair is this
    # reader's one-line error, and stderr stays that line.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(raw))
        # Many PDFs are encrypted only to restrict printing or copying: their user password is
        # empty and they open without one. Any other password is the owner's to give.
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise InputError(file, "PDF is encrypted with a password: save a copy without the password and use that")
        pages = [page.extract_text() or "" for page in reader.pages]
    except InputError:
        raise
    except Exception as exc:  # pypdf raises many types on a damaged file (PdfReadError, ValueError, KeyError...)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(file, f"not a readable PDF ({detail})") from None
    blocks = [block for text in pages for block in pdf_page_blocks(text)]
    if not blocks:
        raise InputError(
            file,
            f"PDF has no text layer ({len(pages)} page{'s' if len(pages) != 1 else ''} of images, "
            "e.g. a scan): run OCR on it first (e.g. ocrmypdf)",
        )
    return "\n\n".join(blocks)


# ----------------------------------------------------------------- HTML

# Elements whose text is not the document's prose: page machinery, navigation, site chrome.
_HTML_SKIPPED = frozenset({"head", "script", "style", "noscript", "template", "svg", "nav", "footer", "form"})
# Elements that end a block (a paragraph, heading, list item, table row, ...).
_HTML_BLOCKS = frozenset(
    {
        "address",
        "article",
        "aside",
        "blockquote",
        "body",
        "caption",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "html",
        "li",
        "main",
        "ol",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "thead",
        "tfoot",
        "tr",
        "ul",
    }
)
_HTML_CELLS = frozenset({"td", "th"})


class _HTMLProse(HTMLParser):
    """Collects the prose of an HTML page as blocks (``html.parser``: tolerant, no dependency)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._current: list[str] = []
        self._skipping: list[str] = []  # open skipped elements, innermost last
        self._cells_in_row = 0

    def _flush(self) -> None:
        text = _WHITESPACE.sub(" ", "".join(self._current)).strip()
        if text:
            self.blocks.append(text)
        self._current = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body" and "head" in self._skipping:  # a page that never closed its <head>
            self._skipping = self._skipping[: self._skipping.index("head")]
        if tag in _HTML_SKIPPED:
            self._skipping.append(tag)
        elif self._skipping:
            return
        elif tag in _HTML_CELLS:
            if self._cells_in_row:
                self._current.append("; ")
            self._cells_in_row += 1
        elif tag == "br":
            self._current.append("\n")
        elif tag in _HTML_BLOCKS:
            self._flush()
            self._cells_in_row = 0 if tag == "tr" else self._cells_in_row

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _HTML_SKIPPED:  # <br/>, <hr/>; a self-closed skipped element holds nothing
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag in _HTML_SKIPPED:
            if tag in self._skipping:  # close it, and whatever unclosed skipped element it holds
                del self._skipping[len(self._skipping) - 1 - self._skipping[::-1].index(tag) :]
        elif not self._skipping and tag in _HTML_BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._current.append(data)

    def prose(self) -> str:
        self._flush()
        return "\n\n".join(self.blocks)


@register_document_reader(".htm")
@register_document_reader(".html")
def read_html(path: Path) -> str:
    """An HTML page's prose: scripts, styles, navigation, footers and forms dropped, blocks kept."""
    text = _document_text(path)
    parser = _HTMLProse()
    parser.feed(text)
    parser.close()
    return parser.prose()


# ----------------------------------------------------------------- documents


def document_types() -> str:
    """The registered document extensions, for messages: ``.txt, .md, ...``."""
    return ", ".join(DOCUMENT_READERS)


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in DOCUMENT_READERS)
            if not found:
                raise InputError(str(path), f"folder holds no documents ({document_types()})")
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
    """One file as a SourceDocument, read by the reader of its extension; InputError for a missing,
    unreadable, non-UTF-8, empty or unsupported file, and for one with no text once markup is removed."""
    path = Path(path)
    file = str(path)
    suffix = path.suffix.lower()
    if suffix not in DOCUMENT_READERS:
        raise InputError(file, f"unsupported document type {suffix or '(none)'!r} (expected {document_types()})")
    cleaned = DOCUMENT_READERS[suffix](path)
    if not cleaned.strip():
        raise InputError(file, "document has no text once markup is removed")
    return SourceDocument(doc_id=doc_id or _doc_id(path, set()), path=file, text=cleaned)


def read_documents(paths: Iterable[str | Path]) -> list[SourceDocument]:
    """Documents from files or folders (a folder contributes its files of every registered type, sorted).

    Doc ids are the file stems, made unique with a ``-2``, ``-3`` suffix when stems repeat.
    """
    files = _expand(paths)
    if not files:
        raise InputError("documents", "no documents given")
    taken: set[str] = set()
    return [read_document(path, _doc_id(path, taken)) for path in files]
