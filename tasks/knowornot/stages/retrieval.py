"""Context selection for leave-one-out (LOO) and synthetic out-of-KB experiments (KnowOrNot §3.2).

The knowledge base is the list of curated QA pairs; a FAISS inner-product index over
their normalised embeddings (row i = pair i) gives cosine-similarity search. For a LOO
question the strategy must never place the question's own pair in the context; the
RAG strategies search k+1 neighbours and drop the own pair, so they still return k.

Strategies (the ``RETRIEVERS`` registry):
  direct        no context at all
  long_context  every other pair, in KB order
  basic_rag     the k pairs nearest the question's embedding
  hyde_rag      the k pairs nearest the mean of the embeddings of LLM-written
                hypothetical answers (mean re-normalised), looked up in the FAISS index

A new strategy is one class with ``select_context`` (or one function) under
``@register_retriever("name", uses_k=..., needs=...)``; the config accepts its name and
the experiment grid uses it, with no other edit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np

from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.knowornot.schema.records import ExperimentInput, OOKBQuestion, QAPair
from refusalbench.tasks.knowornot.stages.embeddings import normalise_rows

if TYPE_CHECKING:
    import faiss

DEFAULT_K = 5
S = TypeVar("S", bound=Callable[..., Any])  # a strategy class, or a select function

# ----------------------------------------------------------------- FAISS index


def build_index(embeddings: np.ndarray) -> faiss.IndexFlatIP:
    """Exact inner-product index over the L2-normalised rows (inner product = cosine)."""
    import faiss

    array = np.asarray(embeddings)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"need a non-empty 2-D embedding array, got shape {array.shape}")
    index = faiss.IndexFlatIP(array.shape[1])
    index.add(normalise_rows(array))
    return index


def index_to_bytes(index: faiss.Index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


def index_from_bytes(data: bytes) -> faiss.Index:
    import faiss

    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8).copy())


def save_index(index: faiss.Index, path: str | Path) -> None:
    """Write the index to a local path or any fsspec URL (e.g. s3://bucket/run/kb.faiss)."""
    import fsspec

    with fsspec.open(str(path), "wb") as handle:
        handle.write(index_to_bytes(index))


def load_index(path: str | Path) -> faiss.Index:
    import fsspec

    with fsspec.open(str(path), "rb") as handle:
        return index_from_bytes(handle.read())


def kb_fingerprint(pairs: Sequence[QAPair], embedder_name: str) -> str:
    """Hash of the pairs' ids and texts plus the embedding model: an index is reusable iff this matches."""
    digest = hashlib.sha256(embedder_name.encode("utf-8"))
    for pair in pairs:
        for part in (pair.id, pair.question, pair.answer):
            digest.update(b"\x1f" + part.encode("utf-8"))
        digest.update(b"\x1e")
    return digest.hexdigest()


def pair_text(pair: QAPair) -> str:
    """What is embedded for the index: question and answer together (the context unit)."""
    return f"Question: {pair.question}\nAnswer: {pair.answer}"


# ----------------------------------------------------------------- strategies


@dataclass(frozen=True)
class IndexedKnowledgeBase:
    """The curated pairs and the FAISS index built on them (row i of the index = pairs[i])."""

    pairs: Sequence[QAPair]
    index: faiss.Index

    def __post_init__(self) -> None:
        if self.index.ntotal != len(self.pairs):
            raise ValueError(f"index holds {self.index.ntotal} vectors for {len(self.pairs)} pairs")


@dataclass(frozen=True)
class RetrievalQuery:
    """One question to find context for.

    ``own_position`` is the position of the question's own pair in the KB (leave-one-out),
    or None for a synthetic question that has no pair. ``question_embedding`` is needed by
    basic_rag, ``hyde_embeddings`` (one row per hypothetical answer) by hyde_rag.
    """

    question_id: str
    own_position: int | None
    question_embedding: np.ndarray | None = None
    hyde_embeddings: np.ndarray | None = None


class Retriever(Protocol):
    """What a strategy class implements (a plain function with the same signature also works)."""

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        """Ids of the pairs to show, best first; never the query's own pair."""
        ...


QueryField = Literal["question_embedding", "hyde_embeddings"]


@dataclass(frozen=True)
class RetrievalStrategy:
    """A registered strategy: its name, what it reads from a query, and how it selects."""

    name: str
    uses_k: bool  # rows record k only for strategies that retrieve k neighbours
    needs: frozenset[str]  # the RetrievalQuery fields it reads (the flow computes only what is needed)
    select: Callable[[RetrievalQuery, IndexedKnowledgeBase, int], Sequence[str]]

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        return list(self.select(query, kb, k))


RETRIEVERS: Registry[RetrievalStrategy] = Registry("retrieval strategy")


def register_retriever(
    name: str, *, uses_k: bool = False, needs: Iterable[QueryField] = (), replace: bool = False
) -> Callable[[S], S]:
    """Decorator: register a strategy class (instantiated once, without arguments) or function.

    ``uses_k``: it retrieves k neighbours (recorded on its rows); ``needs``: the query
    fields it reads, e.g. ``{"question_embedding"}``, so they are computed for it.
    """

    def register(strategy: S) -> S:
        select = strategy().select_context if isinstance(strategy, type) else strategy
        RETRIEVERS.add(name, RetrievalStrategy(name, uses_k, frozenset(needs), select), replace=replace)
        return strategy

    return register


def strategies_need(retrievals: Iterable[str], field: QueryField) -> bool:
    """Whether any of the named strategies reads ``field`` of a query."""
    return any(field in RETRIEVERS.lookup(name).needs for name in retrievals)


def search_excluding(index: faiss.Index, vector: np.ndarray, k: int, exclude: int | None) -> list[int]:
    """Positions of the k nearest rows to ``vector``, never ``exclude``.

    Asks FAISS for one extra neighbour when a row must be excluded, so k remain after
    dropping it (fewer only if the index is smaller).
    """
    if k <= 0:
        return []
    wanted = min(k + (1 if exclude is not None else 0), index.ntotal)
    if wanted == 0:
        return []
    query = normalise_rows(vector)
    _, found = index.search(query, wanted)
    positions = [int(p) for p in found[0] if p >= 0 and p != exclude]
    return positions[:k]


def hyde_query_vector(hyde_embeddings: np.ndarray) -> np.ndarray:
    """Mean of the hypothetical answers' (normalised) embeddings, re-normalised to unit length."""
    rows = normalise_rows(hyde_embeddings)
    if rows.shape[0] == 0:
        raise ValueError("no hypothetical-answer embeddings")
    mean = rows.mean(axis=0)
    if not np.linalg.norm(mean) > 0:
        raise ValueError("hypothetical answers cancel out (mean embedding is zero)")
    vector: np.ndarray = normalise_rows(mean)[0]
    return vector


@register_retriever("direct")
class DirectRetriever:
    """No context: the target answers from what it knows."""

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        return []


@register_retriever("long_context")
class LongContextRetriever:
    """Every other pair of the knowledge base, in KB order."""

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        return [p.id for i, p in enumerate(kb.pairs) if i != query.own_position]


@register_retriever("basic_rag", uses_k=True, needs={"question_embedding"})
class BasicRAGRetriever:
    """The k pairs nearest the question's embedding."""

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        if query.question_embedding is None:
            raise ValueError(f"basic_rag needs the embedding of question {query.question_id}")
        positions = search_excluding(kb.index, query.question_embedding, k, query.own_position)
        return [kb.pairs[i].id for i in positions]


@register_retriever("hyde_rag", uses_k=True, needs={"hyde_embeddings"})
class HydeRAGRetriever:
    """The k pairs nearest the mean embedding of hypothetical answers (HyDE)."""

    def select_context(self, query: RetrievalQuery, kb: IndexedKnowledgeBase, k: int) -> list[str]:
        if query.hyde_embeddings is None:
            raise ValueError(f"hyde_rag needs hypothetical-answer embeddings for question {query.question_id}")
        vector = hyde_query_vector(query.hyde_embeddings)
        positions = search_excluding(kb.index, vector, k, query.own_position)
        return [kb.pairs[i].id for i in positions]


# ----------------------------------------------------------------- experiment grid


def experiment_id(question_id: str, retrieval: str, prompt: str, target: str) -> str:
    return f"{question_id}::{retrieval}::{prompt}::{target}"


def build_experiment_inputs(
    pairs: Sequence[QAPair],
    question_embeddings: np.ndarray,
    index: faiss.Index,
    targets: Sequence[str],
    retrievals: Sequence[str],
    prompts: Sequence[str],
    k: int = DEFAULT_K,
    hyde_embeddings: Mapping[str, np.ndarray] | None = None,
    ookb_questions: Sequence[OOKBQuestion] = (),
    ookb_embeddings: np.ndarray | None = None,
) -> list[ExperimentInput]:
    """The grid questions × retrieval × prompt × target, with each row's context ids.

    - ``pairs``: the curated KB; every pair is asked as a leave-one-out question.
    - ``question_embeddings``: row i embeds ``pairs[i].question`` (basic_rag's query).
    - ``index``: FAISS index over the pairs (row i = pairs[i]), e.g. ``build_index`` of
      the ``pair_text`` embeddings.
    - ``hyde_embeddings``: question id -> (n_answers, dim) embeddings of its hypothetical
      answers; needed for every question when hyde_rag is in ``retrievals``.
    - ``ookb_questions`` / ``ookb_embeddings``: synthetic questions (row-aligned embeddings,
      needed for basic_rag); their context comes from the whole KB and ``ookb`` is True.

    Context depends only on (question, retrieval), so it is computed once and shared by
    every target and prompt. Rows come out ordered by question, retrieval, prompt, target.
    """
    pairs = list(pairs)
    for name, values in (("targets", targets), ("retrievals", retrievals), ("prompts", prompts)):
        if not values:
            raise ValueError(f"{name} must not be empty")
        if len(set(values)) != len(values):
            raise ValueError(f"{name} has duplicates: {list(values)}")
    unknown = RETRIEVERS.unknown(list(retrievals))
    if unknown:
        raise ValueError(RETRIEVERS.unknown_message(unknown))
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    ids = [p.id for p in pairs]
    if len(set(ids)) != len(ids):
        raise ValueError("QA pair ids must be unique")
    ookb_ids = [q.id for q in ookb_questions]
    if len(set(ookb_ids)) != len(ookb_ids) or set(ookb_ids) & set(ids):
        raise ValueError("synthetic question ids must be unique and differ from QA pair ids")
    question_embeddings = np.asarray(question_embeddings)
    if question_embeddings.ndim != 2 or question_embeddings.shape[0] != len(pairs):
        raise ValueError(
            f"question_embeddings must have one row per pair: shape {question_embeddings.shape}, {len(pairs)} pairs"
        )
    if ookb_questions and strategies_need(retrievals, "question_embedding"):
        if ookb_embeddings is None or np.asarray(ookb_embeddings).shape[0] != len(ookb_questions):
            needing = [r for r in retrievals if "question_embedding" in RETRIEVERS[r].needs]
            raise ValueError(
                f"{', '.join(needing)} over synthetic questions needs one ookb_embeddings row per question"
            )
    kb = IndexedKnowledgeBase(pairs=pairs, index=index)
    hyde = hyde_embeddings or {}

    queries: list[tuple[RetrievalQuery, str, str | None, bool]] = []
    for position, pair in enumerate(pairs):
        query = RetrievalQuery(pair.id, position, question_embeddings[position], hyde.get(pair.id))
        queries.append((query, pair.question, pair.answer, False))
    for j, question in enumerate(ookb_questions):
        vector = None if ookb_embeddings is None else np.asarray(ookb_embeddings)[j]
        queries.append(
            (RetrievalQuery(question.id, None, vector, hyde.get(question.id)), question.question, None, True)
        )

    rows: list[ExperimentInput] = []
    for query, question_text, expected, ookb in queries:
        for retrieval in retrievals:
            retriever = RETRIEVERS[retrieval]
            context = retriever.select_context(query, kb, k)
            for prompt in prompts:
                for target in targets:
                    rows.append(
                        ExperimentInput(
                            experiment_id=experiment_id(query.question_id, retrieval, prompt, target),
                            question_id=query.question_id,
                            target=target,
                            retrieval=retrieval,
                            prompt=prompt,
                            k=k if retriever.uses_k else None,
                            context_ids=list(context),
                            question=question_text,
                            expected_answer=expected,
                            ookb=ookb,
                        )
                    )
    return rows


def loo_violations(rows: Sequence[ExperimentInput]) -> list[str]:
    """Rows breaking leave-one-out: a question's own pair in its context, or a repeated context id."""
    problems = []
    for row in rows:
        if row.question_id in row.context_ids:
            problems.append(f"{row.experiment_id}: own pair {row.question_id} is in the context")
        if len(set(row.context_ids)) != len(row.context_ids):
            problems.append(f"{row.experiment_id}: context repeats a pair")
    return problems


def format_context(pairs: Sequence[QAPair]) -> str:
    """The context block for the target's prompt: numbered facts so answers can cite them.

    Empty string for no context (direct retrieval); the prompt template decides what to say then.
    """
    return "\n\n".join(
        f"Fact {n}:\nQuestion: {pair.question}\nAnswer: {pair.answer}" for n, pair in enumerate(pairs, start=1)
    )
