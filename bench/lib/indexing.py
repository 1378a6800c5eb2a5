"""From nothing to served on a folder of documents: the product's own indexing path, timed per stage, beside a bare
encode of the same texts by the same model (the hardware's reference). bench/indexing.py is the script.

What runs is `rag.pipeline.index_folder`, what `rag index` runs, on a fresh data dir. Its stages are timed by wrapping
the functions it calls (as bench/replica_swap.py's stopwatch does: nothing is changed or re-implemented):

    load model         rag.pipeline.load_embedder (index_folder loads the model before anything else)
    parse              rag.pipeline.scan_folder (lists and hashes every file) + ingest_step (parses; PDFs in parallel
                       processes when a core is free); MB/s over the bytes of the files the scan found
    chunk              chunk_step, per strategy; chunks/s
    bm25               bm25_step, per strategy (the bm25s index); chunks/s
    chunk vectors      rag.pipeline.sync_collection, per strategy and model: encode, upsert (dense + BM25 sparse
                       vectors), HNSW build, alias; chunks/s, and the encoding's own seconds the sync reports
    sentence vectors   rag.qa.encoding.store_sentence_vectors (called by embed_step): the answer stage's sentence
                       index, every distinct sentence of the chunk set encoded and stored by the sentence
                       encoder (the model's int8 twin by default, model.sentence_encoder names it); sentences/s
    other              total.other_seconds: the rest of index_folder's wall time (opening the engine, aliases,
                       the tables' writes between)

Memory (MEMORY below): the peak resident set size of this process during each stage.

The reference, after the index is built and in the same process: the chunk set's texts and its distinct sentences
(the very units the sentence stage encoded: none an earlier chunk set stored) encoded by the same model, with
nothing around it:
    fp32   sentence-transformers' `model.encode` of the loaded model (its batch size, normalised), torch's threads
    int8   the model's int8 ONNX twin (rag.embedding.onnx_int8.OnnxInt8Embedder over the folder the float model was
           loaded from) with --onnx-threads intra-op threads; its export (once per weights version, into
           RAG_ONNX_CACHE or the data dir) is timed apart, before any encoding
and the ratio product / bare of seconds for the same texts (1.0: the product encodes at the hardware's speed): the
sentence stage against the bare encode by its own encoder is `sentence_vectors_vs_int8` with the int8 twin (the
default), `sentence_vectors_vs_fp32` with `--sentence-encoder model`.
"""

from __future__ import annotations

import inspect
import os
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from bench.lib.datasets import PDFS, SCIFACT
from bench.lib.loop_data import CONDITIONALQA, TATQA
from bench.lib.results import log

# Document sets of ../shared/datasets, written as the files a user would index (bench.lib.loop_data for the BEIR
# ones: one Markdown file per document; the PDFs copied as they are).
PRESETS = {"scifact": SCIFACT, "tatqa": TATQA, "conditionalqa": CONDITIONALQA, "pdfs": PDFS}
STAGES = ("load model", "parse", "chunk", "bm25", "chunk vectors", "sentence vectors")
MEMORY = (
    "peak resident set size of this process during the stage (resource.getrusage(RUSAGE_SELF).ru_maxrss), its "
    "high-water mark reset to the current RSS before each stage through /proc/self/clear_refs (Linux >= 4.0); where "
    "that is refused (peak_reset false) the figure is the process's peak so far. PDF parse workers are other "
    "processes: children_peak_rss_mb is the largest of them"
)


# --- the folder --------------------------------------------------------------------------------------------------


def _copy(files: list[tuple[Path, str]], target: Path) -> Path:
    for path, relative in files:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / relative)
    return target


def prepare(
    work: Path, *, corpus: str | None = None, folder: Path | None = None, limit: int | None = None, seed: int = 0
) -> tuple[Path, dict]:
    """The folder to index and where it came from: `folder` itself (its first `limit` files, in the scan's order,
    copied under `work` when limited), or preset `corpus` written under `work` (`limit` documents drawn at random
    with `seed` for the BEIR ones, the first `limit` PDFs by name)."""
    from rag.source import scan_folder

    docs = work / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    if folder is not None:
        info = {"corpus": folder.name, "source": str(folder)}
        if limit is None:
            return folder, info
        listed = scan_folder(folder, with_hashes=False).files[:limit]
        return _copy([(f.path, f.doc_id) for f in listed], docs), info
    if corpus == "pdfs":
        pdfs = sorted(PDFS.glob("*.pdf"))[:limit]
        return _copy([(p, p.name) for p in pdfs], docs), {"corpus": corpus, "source": str(PDFS)}
    if corpus not in PRESETS:
        raise ValueError(f"unknown corpus {corpus!r}: one of {', '.join(PRESETS)}")
    from bench.lib.loop_data import load

    # No questions are needed: with a limit, none are kept, so the documents drawn are `limit` of any.
    none = 0 if limit is not None else None
    args = SimpleNamespace(
        seed=seed, users_share=0.5, users_questions=none, test_questions=none, documents=limit, articles=None
    )
    return load(corpus, work, args).docs_dir, {"corpus": corpus, "source": str(PRESETS[corpus])}


# --- timing the product's stages ---------------------------------------------------------------------------------


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _mb(kilobytes: int) -> float:
    return round(kilobytes / 1024, 1)


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return _mb(resource.getrusage(who).ru_maxrss)


def rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as fh:
            return round(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Stages:
    """Calls of wrapped functions, timed, with the peak memory during each and what each produced (`counts`)."""

    calls: list[dict] = field(default_factory=list)
    current: dict = field(default_factory=dict)  # strategy and model of the collection being synced
    _patches: list[tuple[object, str, object]] = field(default_factory=list)

    def wrap(self, module, attr: str, stage: str, counts: Callable[[dict, object, Stages], dict]) -> None:
        real = getattr(module, attr)
        signature = inspect.signature(real)

        def timed(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            reset, before = _reset_peak(), rss_mb()
            started = time.perf_counter()
            result = real(*args, **kwargs)
            seconds = time.perf_counter() - started
            self.calls.append(
                {
                    "stage": stage,
                    "seconds": round(seconds, 3),
                    "rss_before_mb": before,
                    "peak_rss_mb": peak_rss_mb(),
                    "peak_reset": reset,
                    **counts(bound, result, self),
                }
            )
            return result

        setattr(module, attr, timed)
        self._patches.append((module, attr, real))

    def restore(self) -> None:
        for module, attr, real in reversed(self._patches):
            setattr(module, attr, real)
        self._patches.clear()


def _model(bound: dict, embedder, stages: Stages) -> dict:
    return {"model": bound["name"], "version": getattr(embedder, "version", None)}


def _scan(bound: dict, scan, stages: Stages) -> dict:
    return {"files": len(scan.files), "rejected": len(scan.rejected), "bytes": sum(f.size for f in scan.files)}


def _parse(bound: dict, run, stages: Stages) -> dict:
    summary = run.summary
    docs = run.documents
    return {
        "documents": summary["documents"],
        "parsed": summary["parsed"],
        "quarantined": summary["quarantined_total"],
        "pages": summary["pages"],
        "characters": int(docs["n_chars"].sum()) if len(docs) else 0,
    }


def _chunk(bound: dict, run, stages: Stages) -> dict:
    chunks = run.chunks
    return {
        "strategy": bound["chunker"].name,
        "chunks": len(chunks),
        "mean_chars": round(float(chunks["text"].str.len().mean()), 1) if len(chunks) else 0.0,
    }


def _bm25(bound: dict, run, stages: Stages) -> dict:
    return {"strategy": bound["strategy"], "chunks": run.chunks}


def _collection(bound: dict, run, stages: Stages) -> dict:
    stages.current = {"strategy": bound["strategy"], "model": bound["model"]}
    return {
        **stages.current,
        "chunks": len(bound["chunks"]),
        "points": run.points,
        "written": run.added + run.updated,
        "encode_seconds": round(run.embed_seconds, 3),
    }


def _sentences(bound: dict, out: dict, stages: Stages) -> dict:
    return {
        **stages.current,
        "sentences": out["sentences"],
        "encoded": out["encoded"],
        "encode_seconds": out["seconds"],  # the encode-and-store loop, without splitting and the store's lookups
        "encoder": getattr(bound.get("embedder"), "name", None),  # the model, or its int8 twin (sentence_encoder)
    }


def instrument() -> Stages:
    """Wrap the functions index_folder calls; `restore()` puts them back."""
    import rag.pipeline as pipeline
    import rag.qa.encoding as encoding

    stages = Stages()
    stages.wrap(pipeline, "load_embedder", "load model", _model)
    stages.wrap(pipeline, "scan_folder", "scan", _scan)
    stages.wrap(pipeline, "ingest_step", "parse", _parse)
    stages.wrap(pipeline, "chunk_step", "chunk", _chunk)
    stages.wrap(pipeline, "bm25_step", "bm25", _bm25)
    stages.wrap(pipeline, "sync_collection", "chunk vectors", _collection)
    # embed_step imports it when called, from the module: the wrapper is what it gets.
    stages.wrap(encoding, "store_sentence_vectors", "sentence vectors", _sentences)
    return stages


def _rate(items: int, seconds: float) -> float | None:
    return round(items / seconds, 2) if items and seconds > 0 else None


def stage_rows(calls: list[dict]) -> list[dict]:
    """One row per stage (and strategy, model), in STAGES order: seconds, items, their unit and rate, MB/s for
    parsing, peak memory. The scan and the parse make one parse stage."""
    rows: list[dict] = []
    scan = [c for c in calls if c["stage"] == "scan"]
    for call in calls:
        stage = call["stage"]
        if stage == "scan":
            continue
        row = {k: call.get(k) for k in ("stage", "strategy", "model", "seconds", "peak_rss_mb", "peak_reset")}
        if stage == "load model":
            row |= {"items": None, "unit": None}
        elif stage == "parse":
            scanned = scan.pop(0) if scan else {"seconds": 0.0, "bytes": 0, "files": 0, "peak_rss_mb": None}
            row["seconds"] = round(call["seconds"] + scanned["seconds"], 3)
            row["peak_rss_mb"] = max(call["peak_rss_mb"], scanned["peak_rss_mb"] or 0.0)
            row |= {
                "items": call["documents"],
                "unit": "documents",
                "files": scanned["files"],
                "bytes": scanned["bytes"],
                "scan_seconds": scanned["seconds"],
                "quarantined": call["quarantined"],
                "pages": call["pages"],
                "characters": call["characters"],
                "mb_per_s": round(scanned["bytes"] / 1e6 / row["seconds"], 3) if row["seconds"] > 0 else None,
            }
        elif stage in ("chunk", "bm25"):
            row |= {"items": call["chunks"], "unit": "chunks"}
            if "mean_chars" in call:
                row["mean_chars"] = call["mean_chars"]
        else:  # chunk vectors, sentence vectors: what was encoded, and the encoding's own seconds
            chunks = stage == "chunk vectors"
            items = call["written"] if chunks else call["encoded"]
            row |= {"items": items, "unit": "chunks" if chunks else "sentences"}
            row |= {"points": call["points"]} if chunks else {"distinct_sentences": call["sentences"]}
            row |= {"encode_seconds": call["encode_seconds"], "encode_per_s": _rate(items, call["encode_seconds"])}
        row["per_s"] = _rate(row["items"], row["seconds"])
        rows.append(row)
    rows.sort(key=lambda r: STAGES.index(r["stage"]))  # stable: strategies keep the order they ran in
    return rows


# --- what the index holds ------------------------------------------------------------------------------------------


def index_holds(root: Path, report, embedder, qdrant) -> dict[str, dict]:
    """Per chunk set and model: the chunk table's rows, the BM25 index's documents, the collection's points (through
    its alias, as serving reads it) and the sentence vectors stored by `embedder` (the sentence encoder: the model or
    its int8 twin)."""
    from rag.index.bm25 import BM25Index
    from rag.index.qdrant import get_client
    from rag.qa.encoding import open_sentence_store
    from rag.store import CHUNKS_TABLE, TableStore, bm25_root

    tables = TableStore(root / "tables")
    client = get_client(qdrant)
    store = open_sentence_store(root, embedder)
    holds = {}
    for name, collection in report.collections.items():
        strategy = name.split("|", 1)[0]
        holds[name] = {
            "chunk_table": len(tables.read(CHUNKS_TABLE, strategy)),
            "bm25_documents": len(BM25Index.load(bm25_root(root, strategy))),
            "collection_points": client.count(collection_name=collection["alias"], exact=True).count,
            "sentence_vectors_stored": store.count(),  # every chunk set's, for this encoder
        }
    store.close()
    return holds


# --- the bare reference --------------------------------------------------------------------------------------------


def chunk_texts(root: Path, strategy: str) -> list[str]:
    from rag.store import CHUNKS_TABLE, TableStore

    return TableStore(root / "tables").read(CHUNKS_TABLE, strategy)["text"].tolist()


def sentence_texts(texts: list[str]) -> list[str]:
    """The distinct sentence units of `texts`, in the order store_sentence_vectors encodes them."""
    from rag.qa.generators import sentence_units

    return list(dict.fromkeys(u for text in texts for u in sentence_units(text or "")))


def _timed(encode: Callable[[list[str]], object], texts: list[str]) -> dict:
    started = time.perf_counter()
    encode(texts)
    seconds = time.perf_counter() - started
    return {"texts": len(texts), "seconds": round(seconds, 3), "per_s": _rate(len(texts), seconds)}


def fp32_encoder(embedder) -> tuple[Callable[[list[str]], object] | None, dict]:
    """sentence-transformers' own encode of the loaded model, or None (and why) for another kind of embedder."""
    model = getattr(embedder, "_model", None)
    if model is None or not hasattr(model, "encode") or not hasattr(embedder, "source"):
        return None, {"skipped": f"{embedder.name} is not a sentence-transformers model"}
    import torch

    prefix = getattr(embedder, "passage_prefix", "") or ""

    def encode(texts: list[str]):
        return model.encode(
            [prefix + t for t in texts],
            batch_size=embedder.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    return encode, {"batch_size": embedder.batch_size, "threads": torch.get_num_threads()}


def int8_encoder(embedder, threads: int) -> tuple[Callable[[list[str]], object] | None, dict]:
    """The model's int8 ONNX twin over the folder the float model was loaded from, or None (and why)."""
    source = getattr(embedder, "source", None)
    if source is None or not (Path(source) / "tokenizer.json").exists():
        return None, {"skipped": f"{embedder.name} was not loaded from a local folder with a tokenizer.json"}
    from rag.embedding.onnx_int8 import OnnxInt8Embedder, cache_root

    started = time.perf_counter()
    twin = OnnxInt8Embedder(
        f"{embedder.name}-int8",
        str(source),
        embedder.query_prefix,
        embedder.passage_prefix,
        embedder.batch_size,
        threads=threads,
    )
    twin.encode_passages(["warm up the session.", "a second text, longer than the first one."])
    info = {
        "batch_size": twin.batch_size,
        "threads": threads,
        "version": twin.version,
        "load_seconds": round(time.perf_counter() - started, 2),  # with the export, where the cache lacked it
        "cache": str(cache_root()),
    }
    return twin.encode_passages, info


def bare_encode(embedder, texts: dict[str, list[str]], which: list[str], onnx_threads: int) -> dict:
    """Each of `which` (fp32, int8) encoding each list of `texts` (by name), one after the other."""
    out: dict[str, dict] = {}
    for kind in which:
        encode, info = fp32_encoder(embedder) if kind == "fp32" else int8_encoder(embedder, onnx_threads)
        out[kind] = info
        if encode is None:
            log(f"bare {kind}: skipped ({info['skipped']})")
            continue
        for name, items in texts.items():
            out[kind][name] = _timed(encode, items)
            log(f"bare {kind} {name}: {out[kind][name]}")
    return out


def ratios(rows: list[dict], bare: dict, strategy: str) -> dict:
    """Product seconds / bare seconds for the same texts (>1: the product is slower than the bare encode), and the
    sentence stage's seconds over the chunk vectors'."""
    chunk = next((r for r in rows if r["stage"] == "chunk vectors" and r["strategy"] == strategy), None)
    sent = next((r for r in rows if r["stage"] == "sentence vectors" and r["strategy"] == strategy), None)
    out: dict[str, float | None] = {}

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    for kind, figures in bare.items():
        if chunk and "chunks" in figures:
            out[f"chunk_vectors_vs_{kind}"] = ratio(chunk["seconds"], figures["chunks"]["seconds"])
            out[f"chunk_encode_vs_{kind}"] = ratio(chunk["encode_seconds"], figures["chunks"]["seconds"])
        if sent and "sentences" in figures:
            out[f"sentence_vectors_vs_{kind}"] = ratio(sent["seconds"], figures["sentences"]["seconds"])
    if chunk and sent:
        out["sentence_vectors_over_chunk_vectors"] = ratio(sent["seconds"], chunk["seconds"])
    return out


# --- one run -------------------------------------------------------------------------------------------------------


def measure(
    docs: Path,
    root: Path,
    *,
    strategies: list[str],
    model: str,
    bare: list[str],
    onnx_threads: int,
    interval: float = 30.0,
    sentence_encoder: str | None = None,
) -> dict:
    """Index `docs` from nothing into the data dir `root` (RAG_DATA_DIR must name it: the registry and the int8
    export read it) through index_folder, then encode the same texts bare. Every figure of one run."""
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.pipeline import index_folder
    from rag.progress import LogProgress

    qdrant = QdrantSettings(path=str(root / "qdrant"))
    stages = instrument()
    try:
        started = time.perf_counter()
        with LogProgress(log, interval) as progress:
            report = index_folder(
                docs,
                root,
                strategies=strategies,
                models=[model],
                qdrant=qdrant,
                progress=progress,
                sentence_encoder=sentence_encoder,
            )
        total = time.perf_counter() - started
    finally:
        stages.restore()
    from rag.embedding import load_embedder

    from rag.embedding.onnx_int8 import available_cores
    from rag.qa.encoding import DEFAULT_SENTENCE_ENCODER
    from rag.qa.encoding import sentence_encoder as sentence_encoder_of

    embedder = load_embedder(model)  # the instance index_folder used (loaded once per process)
    # The one embed_step used (the twin's session is shared per folder and thread count, as the pipeline asks).
    sentences_by = sentence_encoder_of(
        model, embedder, sentence_encoder or DEFAULT_SENTENCE_ENCODER, threads=available_cores()
    )
    rows = stage_rows(stages.calls)
    for row in rows:
        rate = f"{row['items']} {row['unit']}, {row['per_s']}/s, " if row["items"] is not None else ""
        log(f"{row['stage']} {row.get('strategy') or ''}: {row['seconds']} s, {rate}peak {row['peak_rss_mb']} MB")
    record: dict = {
        "memory": MEMORY,
        "model": {
            "name": model,
            "version": embedder.version,
            "dim": embedder.dim,
            "batch_size": getattr(embedder, "batch_size", None),
            "window": getattr(embedder, "window", None),
            "sentence_encoder": sentences_by.name,
        },
        "stages": rows,
        "total": {
            "seconds": round(total, 3),
            "other_seconds": round(total - sum(c["seconds"] for c in stages.calls), 3),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in rows), default=None),
            "children_peak_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN),
        },
        "calls": stages.calls,
        "report": {
            "parse": {k: v for k, v in report.parse.items() if k != "quarantine"},
            "quarantined": [q["doc_id"] for q in report.parse.get("quarantine", [])],
        },
    }
    log(f"from nothing to served: {record['total']['seconds']} s")
    try:
        record["index_holds"] = index_holds(root, report, sentences_by, qdrant)
    finally:
        close_client(qdrant)
    record["bare"], record["ratios"] = {}, {}
    stored: set[str] = set()  # sentences an earlier chunk set stored: the product does not encode them again
    for strategy in strategies:
        texts = chunk_texts(root, strategy)
        sentences = [u for u in sentence_texts(texts) if u not in stored]
        stored.update(sentences)
        record["bare"][strategy] = bare_encode(embedder, {"chunks": texts, "sentences": sentences}, bare, onnx_threads)
        record["ratios"][strategy] = ratios(rows, record["bare"][strategy], strategy)
        log(f"{strategy}: product / bare {record['ratios'][strategy]}")
    return record
