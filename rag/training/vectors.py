"""Passage vectors a fine-tuning run does not encode again: those the index holds for the weights it starts from.

Hard-negative mining and the untrained start's selection score both encode the chunk set with the base weights, which
the index's collection of the base model already holds (rag.index.stored). While `known_documents` is on, the model's
encode_document answers those texts from a dict and encodes only the others (which it adds), so mining and the start's
evaluation together encode each passage at most once, and none that the index holds. Checkpoints have new weights:
they encode what they score (a bounded sample of the chunk set, rag.training.data.selection_sample).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from rag.index.qdrant import QdrantSettings

Log = Callable[[str], None]
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # what SentenceTransformer.encode_document looks for
PLAIN_CALL = {"batch_size", "show_progress_bar", "convert_to_numpy", "convert_to_tensor", "normalize_embeddings"}
UNSET = {"prompt", "prompt_name", "truncate_dim", "pool", "device", "chunk_size"}  # answered only when None


def plain_documents(model) -> bool:
    """Whether model.encode_document(texts) encodes the texts as they are, as an index's embedder without a passage
    prefix does (SentenceTransformer.encode): no document prompt, no default prompt, no task router."""
    prompts = getattr(model, "prompts", None) or {}
    return (
        not any(prompts.get(name) for name in DOCUMENT_PROMPTS)
        and not getattr(model, "default_prompt_name", None)
        and not any(type(module).__name__ == "Router" for module in model.modules())
    )


@contextmanager
def known_documents(model, vectors: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """While inside, model.encode_document answers texts from `vectors` (L2-normalised passage vectors of the model's
    current weights) and encodes only the others, which it adds to `vectors`. A call it cannot answer alike (a prompt,
    a truncation, a single text, other options) goes to the model unchanged. Leave before the weights change."""
    original = model.encode_document
    scale_free = any(type(m).__name__ == "Normalize" for m in model) or (
        getattr(model, "similarity_fn_name", None) == "cosine"
    )

    def encode_document(*args, **kwargs):
        inputs = args[0] if len(args) == 1 else None
        if (
            inputs is None
            or isinstance(inputs, str)
            or not len(inputs)
            or any(kwargs.get(k) is not None for k in UNSET)
            or set(kwargs) - PLAIN_CALL - UNSET
            or not (scale_free or kwargs.get("normalize_embeddings"))
        ):
            return original(*args, **kwargs)
        texts = list(inputs)
        missing = [t for t in dict.fromkeys(texts) if t not in vectors]
        if missing:
            encoded = original(
                missing,
                batch_size=kwargs.get("batch_size", 32),
                show_progress_bar=kwargs.get("show_progress_bar"),
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
            vectors.update(zip(missing, np.asarray(encoded, dtype=np.float32)))
        rows = np.vstack([vectors[t] for t in texts])
        if kwargs.get("convert_to_tensor"):
            import torch

            return torch.from_numpy(rows).to(model.device)
        return rows

    model.encode_document = encode_document  # an instance attribute: the class's method comes back on exit
    try:
        yield vectors
    finally:
        del model.encode_document


def index_location(root: Path) -> QdrantSettings:
    """Where the data dir's index is: QDRANT_URL or RAG_QDRANT_PATH when set, else `<root>/qdrant`."""
    settings = QdrantSettings.from_env()
    if settings.url is None and settings.path is None:
        settings = settings.model_copy(update={"path": str(Path(root) / "qdrant")})
    return settings


def index_passages(settings: QdrantSettings, strategy: str, base_model: str) -> Callable:
    """A function (model, texts, log) -> {text: vector}: the vectors the index holds for `texts` under the model's
    current weights, read from the collections of chunk set `strategy` filled by embedder `base_model` with exactly
    these weights (the version in the collection's name), when the model encodes passages as that embedder did (same
    length, no prompt, no prefix). Nothing (an empty dict, said in the log) when there is no such collection or the
    index cannot be opened now."""

    def stored(model, texts: list[str], log: Log) -> dict[str, np.ndarray]:
        from rag.embedding import load_embedder, model_key, weights_digest
        from rag.index.qdrant import QdrantLockedError, reading_client
        from rag.index.stored import StoredVectors, collection_model, weights_collections

        local = settings.url is None and settings.location != ":memory:"
        if not texts or not plain_documents(model) or (local and not Path(settings.location).is_dir()):
            return {}
        version = weights_digest(model)
        try:
            with reading_client(settings) as client:
                collections = weights_collections(client, version, strategy=strategy)
                if not collections:
                    return {}
                embedder = load_embedder(base_model)
                window = getattr(embedder, "window", None)
                if (
                    embedder.version != version
                    or getattr(embedder, "passage_prefix", "")
                    or window != model.max_seq_length
                ):
                    log(
                        f"the index's vectors of {base_model} are not the ones training would encode (prefix, or a "
                        f"window of {window} tokens against {model.max_seq_length}): passages are encoded"
                    )
                    return {}
                collections = [c for c in collections if collection_model(c) == model_key(embedder.name)]
                found = StoredVectors(client, collections)(list(texts))
        except QdrantLockedError as exc:
            log(f"the index is busy ({exc}): passages are encoded instead of read from it")
            return {}
        if found:
            log(
                f"{len(found)} of {len(set(texts))} passages' vectors read from the index ({', '.join(collections)}), "
                "not encoded again"
            )
        return found

    return stored


@contextmanager
def index_vectors(root: Path, *embedders) -> Iterator[tuple]:
    """The `embedders` (TextEmbedders), each one's encode_passages first reading the vectors the data dir's index
    holds for its exact weights (any chunk set's collection of that version: rag.index.stored) and encoding only the
    rest; an embedder as it is when the index cannot be opened now or holds none of its weights. The gate scores
    production, and a candidate whose best checkpoint kept the weights it started from, on passages the index has
    encoded with those weights: reading them keeps each text encoded once per weights version."""
    from rag.embedding import model_key
    from rag.index.qdrant import QdrantLockedError, reading_client
    from rag.index.stored import ReusingEmbedder, StoredVectors, weights_collections

    settings = index_location(root)
    local = settings.url is None and settings.location != ":memory:"
    if local and not Path(settings.location).is_dir():
        yield embedders
        return
    with ExitStack() as stack:
        try:
            client = stack.enter_context(reading_client(settings))
        except QdrantLockedError:  # a writer holds the folder: encoding is slower, never wrong
            yield embedders
            return

        def reading(embedder):
            version = getattr(embedder, "version", None)
            if version is None:
                return embedder
            # The version is the weights' hash: any chunk set's collection of it holds these passages' vectors,
            # unless a passage prefix (a setting of the name, not of the weights) encoded them: then the name's only.
            by_name = model_key(embedder.name) if getattr(embedder, "passage_prefix", "") else None
            collections = weights_collections(client, version, model=by_name)
            return ReusingEmbedder(embedder, StoredVectors(client, collections)) if collections else embedder

        yield tuple(reading(e) for e in embedders)
