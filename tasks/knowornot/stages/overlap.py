"""The duplicate-overlap audit of a run's question set (KnowOrNot paper, App. D.1).

Leave-one-out is only fair if no kept question can be answered by another kept pair.
The paper checked this by hand (0-1.5% of questions overlapped another); here the same
question is asked of the data: for each kept question, how similar is the most similar
other kept question, by TF-IDF cosine (shared wording) and by embedding cosine (shared
meaning)? A question counts as overlapping at a threshold when some other question is
at least that similar. The most similar pairs are listed so a person can check them.

When the semantic filter ran with threshold d and the same embedder, every kept pair is
below 1 - d by construction; the embedding levels above that are a check of the filter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refusalbench.tasks.knowornot.schema.json_files import OverlapAudit, OverlapLevel, SimilarPair
from refusalbench.tasks.knowornot.schema.records import FilterReport, QAPair
from refusalbench.tasks.knowornot.stages.diversity import tfidf_similarity
from refusalbench.tasks.knowornot.stages.embeddings import Embedder

TFIDF_THRESHOLDS = (0.5, 0.7, 0.9)
EMBEDDING_THRESHOLDS = (0.7, 0.8, 0.9)
MOST_SIMILAR = 10


def nearest_similarity(similarity: np.ndarray) -> np.ndarray:
    """Per item, its highest similarity to another item (-inf when there is no other)."""
    n = similarity.shape[0]
    if n < 2:
        return np.full(n, -np.inf)
    others = similarity.astype(np.float64, copy=True)
    np.fill_diagonal(others, -np.inf)
    nearest: np.ndarray = others.max(axis=1)
    return nearest


def overlap_levels(similarity: np.ndarray, thresholds: Sequence[float]) -> list[OverlapLevel]:
    """Per threshold: how many items have another item at least that similar (the diagonal is ignored)."""
    n = similarity.shape[0]
    best = nearest_similarity(similarity)
    levels = []
    for threshold in thresholds:
        count = int((best >= threshold - 1e-9).sum())
        levels.append(OverlapLevel(threshold=threshold, n_overlapping=count, overlap_rate=count / n if n else None))
    return levels


def most_similar_pairs(
    pairs: Sequence[QAPair], tfidf: np.ndarray, embedding: np.ndarray, limit: int = MOST_SIMILAR
) -> list[SimilarPair]:
    """The ``limit`` pairs of distinct questions that are most alike (the larger of the two similarities first)."""
    n = len(pairs)
    if n < 2:
        return []
    upper = np.triu_indices(n, k=1)
    score = np.maximum(tfidf[upper], embedding[upper])
    order = np.argsort(-score, kind="stable")[:limit]
    return [
        SimilarPair(
            id_a=pairs[i].id,
            id_b=pairs[j].id,
            question_a=pairs[i].question,
            question_b=pairs[j].question,
            tfidf=round(float(tfidf[i, j]), 4),
            embedding=round(float(embedding[i, j]), 4),
        )
        for i, j in ((int(upper[0][k]), int(upper[1][k])) for k in order)
    ]


def overlap_audit(
    pairs: Sequence[QAPair],
    embedder: Embedder,
    filter_report: FilterReport | None = None,
    tfidf_thresholds: Sequence[float] = TFIDF_THRESHOLDS,
    embedding_thresholds: Sequence[float] = EMBEDDING_THRESHOLDS,
) -> OverlapAudit:
    """The audit of the kept ``pairs``' questions, with the filters' removals from ``filter_report``."""
    questions = [p.question for p in pairs]
    tfidf = tfidf_similarity(questions) if questions else np.zeros((0, 0))
    vectors = embedder.embed(questions)
    embedding = np.asarray(vectors @ vectors.T, dtype=np.float64) if questions else np.zeros((0, 0))
    return OverlapAudit(
        n_questions=len(pairs),
        embedder=str(getattr(embedder, "name", type(embedder).__name__)),
        tfidf=overlap_levels(tfidf, tfidf_thresholds),
        embedding=overlap_levels(embedding, embedding_thresholds),
        most_similar=most_similar_pairs(pairs, tfidf, embedding),
        nearest_tfidf=[round(float(v), 4) for v in nearest_similarity(tfidf) if np.isfinite(v)],
        nearest_embedding=[round(float(v), 4) for v in nearest_similarity(embedding) if np.isfinite(v)],
        n_input=filter_report.n_input if filter_report else None,
        removed_keyword=filter_report.removed_keyword if filter_report else None,
        removed_semantic=filter_report.removed_semantic if filter_report else None,
    )
