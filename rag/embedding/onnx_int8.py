"""A sentence-transformers model as int8 ONNX, run with plain onnxruntime: a few times faster per query on a CPU.

At first use the model folder's transformer is exported with `torch.onnx.export` (the TorchScript exporter, so
only `onnx` is needed) and its weights dynamically quantised to int8 (`onnxruntime.quantization.quantize_dynamic`),
into `<data dir>/onnx-int8/<weights version>-<recipe>/`: once per weights version, reused by every later load.
Texts are tokenized with the folder's tokenizer.json (`tokenizers`), truncated at the model's `max_seq_length`
(not the 128 that MiniLM's tokenizer.json ships with); the token embeddings are pooled as the folder's
1_Pooling config says (mean over the attention mask, or [CLS]) and L2-normalised, as sentence-transformers does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import warnings
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from rag.embedding import _hash_files, _Prefixed, normalize_rows, weights_version
from rag.store import data_dir

# Bump when the export or quantisation changes: a new recipe gets a new cache folder (and new vectors, new version).
RECIPE = "opset17-qint8-perchannel-r1"
MODEL_FILE = "model.int8.onnx"
META_FILE = "export.json"
PAIRING_FILE = "paired.json"  # the float model a probe accepted this twin for (int8_query_encoder)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def cache_root() -> Path:
    """`RAG_ONNX_CACHE` (exports are keyed by weights version and recipe, so data dirs can share one), else
    `<data dir>/onnx-int8`."""
    return Path(os.environ.get("RAG_ONNX_CACHE") or data_dir() / "onnx-int8")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def model_settings(model_dir: Path) -> dict:
    """What sentence-transformers would do with this folder: window, pooling, normalisation."""
    modules = _read_json(model_dir / "modules.json")
    pooling_dir = next((m.get("path", "") for m in modules if m.get("type", "").endswith(".Pooling")), "1_Pooling")
    pooling = _read_json(model_dir / pooling_dir / "config.json")
    if pooling.get("pooling_mode_cls_token"):
        mode = "cls"
    elif pooling.get("pooling_mode_mean_tokens", True) and not any(
        pooling.get(k) for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    ):
        mode = "mean"
    else:
        raise ValueError(f"{model_dir}: pooling {pooling} is not supported by the int8 embedder (mean or cls only)")
    config = _read_json(model_dir / "config.json")
    max_len = _read_json(model_dir / "sentence_bert_config.json").get("max_seq_length") or config.get(
        "max_position_embeddings", 512
    )
    return {
        "pooling": mode,
        "max_seq_length": int(max_len),
        "normalize": any(m.get("type", "").endswith(".Normalize") for m in modules),
    }


def _export(model_dir: Path, target: Path) -> None:
    """torch -> ONNX (float) -> dynamically quantised int8 ONNX, written to `target`."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # Eager attention: the SDPA path may drop an all-ones mask while tracing, baking "no padding" into the graph.
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    names = [n for n in INPUTS if n in inspect.signature(model.forward).parameters]

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    # A padded example (second row shorter) so masking is traced as data, not as a constant.
    ids = torch.tensor([[101, 7592, 2088, 2003, 2307, 102], [101, 7592, 102, 0, 0, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    axes = {n: {0: "batch", 1: "sequence"} for n in (*names, "token_embeddings")}
    float_path = target.parent / "model.float.onnx"
    # The legacy exporter's deprecation and tracer warnings, and quantize_dynamic's advice to pre-process (its
    # symbolic shape inference fails on this graph), are expected: silenced for the export only.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TokenEmbeddings(model),
            tuple(example[n] for n in names),
            str(float_path),
            dynamo=False,
            input_names=names,
            output_names=["token_embeddings"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
        )
        logging.disable(logging.WARNING)
        try:
            # Per-channel scales: per-tensor int8 weights leave MiniLM at cosine ~0.94 to the float vectors, per
            # channel ~0.99 (40 SciFact queries + 40 abstracts).
            quantize_dynamic(str(float_path), str(target), weight_type=QuantType.QInt8, per_channel=True)
        finally:
            logging.disable(logging.NOTSET)
    float_path.unlink()


def ensure_int8_model(model_dir: Path, root: Path | None = None) -> Path:
    """The int8 ONNX file for `model_dir`, exported once per (weights version, recipe) and reused afterwards.
    Written into a staging folder renamed into place, so a crash or a concurrent export never leaves half a model."""
    model_dir = Path(model_dir)
    root = Path(root) if root is not None else cache_root()
    source_version = weights_version(model_dir)
    folder = root / f"{source_version}-{RECIPE}"
    if (folder / MODEL_FILE).exists():
        return folder / MODEL_FILE
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{source_version}-", dir=root))
    try:
        _export(model_dir, staging / MODEL_FILE)
        import torch

        meta = {
            "source": str(model_dir),
            "source_weights_version": source_version,
            "recipe": RECIPE,
            "torch": torch.__version__,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (staging / META_FILE).write_text(json.dumps(meta, indent=2))
        try:
            os.replace(staging, folder)
        except OSError:
            if not (folder / MODEL_FILE).exists():  # not a concurrent export that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder / MODEL_FILE


def _threads() -> int:
    return int(os.environ.get("RAG_ONNX_THREADS") or 1)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows), for an encode that
    has the machine to itself (indexing)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class OnnxInt8Embedder(_Prefixed):
    """A sentence-transformers model folder served as int8 ONNX through onnxruntime (CPU)."""

    def __init__(
        self,
        name: str,
        source: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        threads: int | None = None,
        cache: Path | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model_dir = Path(source)
        if not (model_dir / "tokenizer.json").exists():
            raise ValueError(
                f"the int8 embedder needs a local sentence-transformers folder with a tokenizer.json, not {source!r}"
            )
        settings = model_settings(model_dir)
        self.model_path = ensure_int8_model(model_dir, cache)
        self.name, self.batch_size = name, batch_size
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.window = settings["max_seq_length"]
        self._pooling = settings["pooling"]

        # Three configured copies (no state flipped per call, so threads can share the embedder): single texts
        # unpadded, batches padded to their longest text, counting untruncated. The shipped tokenizer.json's own
        # settings (MiniLM's: pad and truncate at 128) are replaced.
        tokenizer_file = str(model_dir / "tokenizer.json")
        self._single, self._batch, self._counter = (Tokenizer.from_file(tokenizer_file) for _ in range(3))
        shipped = self._single.padding or {}
        for tok in (self._single, self._batch, self._counter):
            tok.no_padding()
            tok.enable_truncation(self.window)
        self._counter.no_truncation()
        self._batch.enable_padding(
            pad_id=shipped.get("pad_id", 0),
            pad_type_id=shipped.get("pad_type_id", 0),
            pad_token=shipped.get("pad_token", "[PAD]"),
        )

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or _threads()
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between queries
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(self.model_path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self.dim = int(self._session.get_outputs()[0].shape[-1])
        # The int8 file's own hash: these vectors differ from the float model's, so the version does too.
        self.version = hashlib.sha256(
            f"int8:{_hash_files([self.model_path])}:{self._pooling}:{self.window}".encode()
        ).hexdigest()[:12]

    def _run(self, encodings) -> np.ndarray:
        arrays = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        tokens = self._session.run(None, {n: arrays[n] for n in self._inputs})[0]
        if self._pooling == "cls":
            return tokens[:, 0]
        mask = arrays["attention_mask"][..., None].astype(np.float32)
        return (tokens * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)

    def _embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) == 1:  # a single query: no padding at all
            return self._run([self._single.encode(texts[0])])
        return self._run(self._batch.encode_batch(texts))

    def _batched(self, texts: list[str], prefix: str) -> np.ndarray:
        """Batches of similar lengths (as sentence-transformers sorts them): less padding to compute over."""
        if len(texts) <= 1:
            return super()._batched(texts, prefix)
        texts = [prefix + t for t in texts]
        order = np.argsort([-len(t) for t in texts], kind="stable")
        rows = np.empty((len(texts), self.dim), dtype=np.float32)
        for i in range(0, len(texts), self.batch_size):
            part = order[i : i + self.batch_size]
            rows[part] = self._embed([texts[j] for j in part])
        return normalize_rows(rows)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._counter.encode_batch([self.passage_prefix + t for t in texts])]


# Questions of the kinds people ask, to check that an int8 query encoder agrees with the float model it stands in for.
PROBE_QUESTIONS = (
    "What does the proposed rule require operators to do?",
    "How many patients were enrolled in the trial?",
    "Who signed the treaty in 1648?",
    "vitamin d hip fracture risk elderly",
)
# Per-channel int8 MiniLM stays at cosine >= ~0.98 to the float vectors; far below means other weights or a broken
# export, whose question vectors would rank the float index's passages badly without any error.
MIN_PROBE_COSINE = 0.95


def int8_query_encoder(
    model: str, embedder, *, threads: int | None = None
) -> tuple[OnnxInt8Embedder | None, str | None]:
    """The int8 ONNX twin of `embedder` (loaded as `model`) for encoding questions against the float model's passage
    vectors, or (None, why not): the float model then encodes questions too. `threads`: its session's intra-op
    threads (None: RAG_ONNX_THREADS, default 1, what a server answering questions side by side wants; indexing, which
    encodes one batch after another, passes every core). The twin is exported from the very
    folder the float model was loaded from (no name is resolved again, so a promotion in between cannot pair other
    weights, and no hub id is looked up), and accepted only when its vectors of a few probe questions agree with the
    float model's (cosine >= MIN_PROBE_COSINE). An accepted pair is recorded beside the twin (_record_pairing), so a
    later process can take the model from paired_embedder without loading it."""
    if isinstance(embedder, OnnxInt8Embedder):
        return None, None  # already int8: it encodes its own questions
    if isinstance(embedder, PairedEmbedder):
        return embedder.twin, None  # paired when it was recorded (paired_embedder)
    source = getattr(embedder, "source", None)
    if source is None or not (Path(source) / "tokenizer.json").exists():
        return None, (
            f"{model!r} was not loaded from a local sentence-transformers folder with a tokenizer.json, so it has no "
            "int8 twin: questions use the float model"
        )
    try:
        encoder = _twin(
            f"{embedder.name}-int8",
            str(source),
            embedder.query_prefix,
            embedder.passage_prefix,
            embedder.batch_size,
            threads or _threads(),
        )
    except Exception as exc:  # no onnxruntime, a model the exporter cannot handle
        return None, f"no int8 query encoder for {model!r} ({type(exc).__name__}: {exc}); questions use the float model"
    if encoder.dim != embedder.dim:
        return None, f"the int8 twin of {model!r} has another dimension; questions use the float model"
    cosine = float(
        (encoder.encode_queries(list(PROBE_QUESTIONS)) * embedder.encode_queries(list(PROBE_QUESTIONS))).sum(1).min()
    )
    if cosine < MIN_PROBE_COSINE:
        return None, (
            f"the int8 query encoder of {model!r} disagrees with its float model (probe cosine {cosine:.3f} < "
            f"{MIN_PROBE_COSINE}): questions use the float model"
        )
    _record_pairing(encoder, embedder, cosine)
    return encoder, None


def _pairing(embedder, cosine: float) -> dict:
    return {
        "float_version": embedder.version,
        "dim": int(embedder.dim),
        "window": getattr(embedder, "window", None),
        "query_prefix": embedder.query_prefix,
        "passage_prefix": embedder.passage_prefix,
        "probe_cosine": round(cosine, 4),
    }


def _record_pairing(twin: OnnxInt8Embedder, embedder, cosine: float) -> None:
    """Beside the twin's file: what a server needs of the float model it stood in for (its version, which names its
    collections; dimension; window; prefixes) and the probe that accepted the pair, so that a later process can pair
    them without loading the float model (paired_embedder). Best effort: without it, the next process loads the
    float model and pairs again."""
    path = twin.model_path.parent / PAIRING_FILE
    record = _pairing(embedder, cosine)
    try:
        if _read_json(path) == record:
            return
        staging = path.with_name(f".{PAIRING_FILE}.{os.getpid()}")
        staging.write_text(json.dumps(record, indent=2))
        os.replace(staging, path)  # a reader sees the old record or the new one, never half of one
    except (OSError, ValueError):
        logging.getLogger(__name__).warning("could not record the int8 pairing in %s", path, exc_info=True)


class PairedEmbedder(_Prefixed):
    """A float model as a server searching its collection needs it when the int8 twin encodes the questions: the
    model's name, version (its collections are named by it), dimension and window, read from the pairing an earlier
    process recorded (int8_query_encoder, with both loaded and the probe passed), questions encoded by the twin. The
    float model (torch and sentence-transformers: about 500 MB of a server's memory) is loaded only if a passage text
    must be encoded as the model itself would (a sentence the data dir's store lacks under sentence_encoder "model")."""

    def __init__(self, name: str, record: dict, twin: OnnxInt8Embedder, load_float) -> None:
        self.name, self.version, self.dim = name, str(record["float_version"]), int(record["dim"])
        self.window = record.get("window")
        self.batch_size = twin.batch_size
        self.query_prefix, self.passage_prefix = twin.query_prefix, twin.passage_prefix
        self.twin, self._load_float, self._float = twin, load_float, None
        self._lock = threading.Lock()

    def float_model(self):
        """The float model, loaded at the first call (and checked to be the weights the pairing recorded)."""
        with self._lock:
            if self._float is None:
                logging.getLogger(__name__).info("%s: loading the float model to encode passages", self.name)
                model = self._load_float()
                if model.version != self.version:
                    raise RuntimeError(
                        f"{self.name}: the float model's weights ({model.version}) are not the ones its int8 twin was "
                        f"paired with ({self.version}): restart the server so that it pairs them again"
                    )
                self._float = model
        return self._float

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self.twin.encode_queries(texts)

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        return self.float_model().encode_passages(texts)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.float_model().encode(texts)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.twin.count_tokens(texts)  # the same tokenizer.json and window as the float model


def paired_embedder(
    name: str, source: str, query_prefix: str, passage_prefix: str, batch_size: int, load_float
) -> tuple[PairedEmbedder | None, str | None]:
    """The float model `name` (weights in the folder `source`) paired with its int8 twin without loading it, when a
    process that held both recorded the pair (int8_query_encoder) for this folder's weights and these prefixes; else
    (None, why not): the caller loads the float model, and pairing it records the pair for the next process.
    `load_float`: loads the float model if a passage must be encoded after all."""
    folder = Path(source)
    if not (folder / "tokenizer.json").exists():
        return None, f"{source!r} is not a local sentence-transformers folder with a tokenizer.json"
    twin_dir = cache_root() / f"{weights_version(folder)}-{RECIPE}"
    record = _read_json(twin_dir / PAIRING_FILE) if (twin_dir / MODEL_FILE).exists() else {}
    if not record:
        return None, f"no int8 twin of {name!r} paired yet under {cache_root()}"
    if (record.get("query_prefix"), record.get("passage_prefix")) != (query_prefix, passage_prefix):
        return None, f"the int8 twin of {name!r} was paired with other prefixes"
    twin = _twin(f"{name}-int8", str(folder), query_prefix, passage_prefix, batch_size, _threads())
    if twin.dim != record.get("dim"):
        return None, f"the int8 twin of {name!r} has another dimension than its pairing records"
    return PairedEmbedder(name, record, twin, load_float), None


@lru_cache(maxsize=16)
def _twin(
    name: str, source: str, query_prefix: str, passage_prefix: str, batch_size: int, threads: int
) -> OnnxInt8Embedder:
    """One session per model folder, thread count and process: every index a server opens (each re-index swap)
    shares it."""
    return OnnxInt8Embedder(name, source, query_prefix, passage_prefix, batch_size, threads=threads)
