"""Diversity filters that keep QA pairs informationally distinct (KnowOrNot §3.1, App. A.2).

Leave-one-out only works if no other pair can answer a withheld question, so
near-duplicate pairs are removed before experiments.

Keyword filter. Each question is reduced to content words (lowercased, punctuation and
English stop words removed, Porter-stemmed) and given a TF-IDF vector over the pool of
questions (sublinear term frequency, smoothed IDF, no length normalisation). Its
*uniqueness score* is the mean TF-IDF weight of its terms: high when the question is
made of words that few other questions use, low when its words are shared across the
pool (paraphrases lower each other's IDF). The mean, not the sum, so a question is not
rewarded merely for being long. Pairs scoring below ``min + threshold * (max - min)``
are dropped; ``threshold = 0`` keeps everything, a pool with equal scores is kept whole.

Semantic filter. Greedy, in input order: a pair is kept only if its cosine distance
(1 - cosine similarity) to every pair kept so far is at least ``threshold``. The first
pair is always kept; earlier pairs take precedence over their later near-duplicates.

Both filters run keyword first, then semantic on what remains (the original library's
order). Default threshold 0.3 for each (the paper's Table 1; CPF used 0.4). A multi-base
run filters each base on its own, with that base's filters and thresholds where it sets them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np

from refusalbench.tasks.knowornot.schema.records import FilterReport, QAPair
from refusalbench.tasks.knowornot.stages.embeddings import normalise_rows

DEFAULT_THRESHOLD = 0.3
FilterMethod = Literal["keyword", "semantic", "both", "none"]


def _check_threshold(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be between 0 and 1, got {value}")


@functools.lru_cache(maxsize=1)
def _stemmer_and_stop_words() -> tuple[object, frozenset[str]]:
    from nltk.stem import PorterStemmer  # rule-based: needs no NLTK data download
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return PorterStemmer(), frozenset(ENGLISH_STOP_WORDS)


def load_text_tools() -> None:
    """Import what TF-IDF needs (scikit-learn, NLTK's stemmer: seconds of CPU on 2 cores), e.g. on a
    background thread while a run starts, so the filters and the overlap audit find it loaded."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: F401

    _stemmer_and_stop_words()


def _content_words(text: str) -> str:
    stemmer, stop_words = _stemmer_and_stop_words()
    words = re.findall(r"[a-z0-9]+", text.lower())
    return " ".join(stemmer.stem(w) for w in words if w not in stop_words)  # type: ignore[attr-defined]


def tfidf_uniqueness(texts: Sequence[str]) -> np.ndarray:
    """Uniqueness score per text: mean TF-IDF weight of its content terms within the pool."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not texts:
        return np.zeros(0, dtype=np.float64)
    prepared = [_content_words(t) for t in texts]
    if not any(prepared):
        return np.zeros(len(texts), dtype=np.float64)
    vectorizer = TfidfVectorizer(token_pattern=r"\S+", sublinear_tf=True, smooth_idf=True, norm=None)
    matrix = vectorizer.fit_transform(prepared)
    sums = np.asarray(matrix.sum(axis=1)).ravel()
    counts = np.diff(matrix.indptr)  # distinct terms per text (CSR row lengths)
    means: np.ndarray = np.divide(sums, counts, out=np.zeros_like(sums, dtype=np.float64), where=counts > 0)
    return means


def tfidf_similarity(texts: Sequence[str]) -> np.ndarray:
    """Pairwise cosine similarity of the texts' TF-IDF vectors (content words, as the keyword filter sees them)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    prepared = [_content_words(t) for t in texts]
    if not any(prepared):
        return np.zeros((len(texts), len(texts)), dtype=np.float64)
    matrix = TfidfVectorizer(token_pattern=r"\S+", sublinear_tf=True, smooth_idf=True).fit_transform(prepared)
    return np.asarray((matrix @ matrix.T).todense(), dtype=np.float64)


def keyword_filter(questions: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Positions (in input order) of the questions whose uniqueness is at least min + threshold·range."""
    _check_threshold("keyword threshold", threshold)
    scores = tfidf_uniqueness(questions)
    if scores.size == 0:
        return []
    low, high = float(scores.min()), float(scores.max())
    cutoff = low + threshold * (high - low)
    # A tiny tolerance so floating-point noise never drops the minimum when threshold is 0.
    return [i for i, s in enumerate(scores) if s >= cutoff - 1e-12]


def semantic_filter(embeddings: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Positions kept by greedy selection with minimum cosine distance ``threshold`` to every kept row."""
    _check_threshold("semantic threshold", threshold)
    array = np.asarray(embeddings)
    if array.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array, got shape {array.shape}")
    if array.shape[0] == 0:
        return []
    vectors = normalise_rows(array)
    kept: list[int] = []
    for i in range(vectors.shape[0]):
        if kept:
            distances = 1.0 - vectors[kept] @ vectors[i]
            if float(distances.min()) < threshold - 1e-6:
                continue
        kept.append(i)
    return kept


def filter_method(filters: Sequence[str]) -> FilterMethod:
    """The method a config's ``filters`` list names: both, one of them, or none (``[]``: a released set
    that its authors already filtered is used as it is)."""
    chosen = set(filters)
    if chosen == {"keyword", "semantic"}:
        return "both"
    if not chosen:
        return "none"
    (only,) = chosen
    if only not in ("keyword", "semantic"):
        raise ValueError(f"unknown diversity filter {only!r} (keyword, semantic)")
    return only  # type: ignore[return-value]


def diversity_filter(
    pairs: Sequence[QAPair],
    embeddings: np.ndarray | None = None,
    method: FilterMethod = "both",
    keyword_threshold: float = DEFAULT_THRESHOLD,
    semantic_threshold: float = DEFAULT_THRESHOLD,
) -> tuple[list[QAPair], FilterReport]:
    """Apply the keyword and/or semantic filter; return the kept pairs (input order) and a report.

    ``embeddings`` are row-aligned with ``pairs`` (embed the questions: the filters judge
    whether questions are distinct); required unless ``method`` is "keyword" or "none".
    """
    pairs = list(pairs)
    ids = [p.id for p in pairs]
    if len(set(ids)) != len(ids):
        raise ValueError("QA pair ids must be unique")
    if method not in ("keyword", "semantic", "both", "none"):
        raise ValueError(f"unknown filter method {method!r} (keyword, semantic, both, none)")
    use_keyword = method in ("keyword", "both")
    use_semantic = method in ("semantic", "both")
    if use_semantic:
        if embeddings is None:
            raise ValueError("the semantic filter needs embeddings")
        embeddings = np.asarray(embeddings)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(pairs):
            raise ValueError(
                f"embeddings must have one row per pair: got shape {embeddings.shape} for {len(pairs)} pairs"
            )

    positions = list(range(len(pairs)))
    removed_keyword: list[str] = []
    removed_semantic: list[str] = []
    if use_keyword and positions:
        kept = set(keyword_filter([pairs[i].question for i in positions], keyword_threshold))
        removed_keyword = [pairs[positions[j]].id for j in range(len(positions)) if j not in kept]
        positions = [positions[j] for j in sorted(kept)]
    if use_semantic and positions:
        assert embeddings is not None
        kept_local = semantic_filter(embeddings[positions], semantic_threshold)
        kept_set = set(kept_local)
        removed_semantic = [pairs[positions[j]].id for j in range(len(positions)) if j not in kept_set]
        positions = [positions[j] for j in kept_local]

    kept_pairs = [pairs[i] for i in positions]
    report = FilterReport(
        method=method,
        n_input=len(pairs),
        n_kept=len(kept_pairs),
        removed_keyword=len(removed_keyword),
        removed_semantic=len(removed_semantic),
        keyword_threshold=keyword_threshold if use_keyword else None,
        semantic_threshold=semantic_threshold if use_semantic else None,
        kept_ids=[p.id for p in kept_pairs],
        removed_keyword_ids=removed_keyword,
        removed_semantic_ids=removed_semantic,
    )
    return kept_pairs, report
