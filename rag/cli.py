"""Library commands that run without Dagster: `rag parse` and `rag chunk` (for debugging and harnesses)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rag.parsing import ParseError, ParseSettings, parse_file
from rag.qa.models import DEFAULT_MODE, SERVED_MODEL

if TYPE_CHECKING:
    from rag.embedding import WindowFit


def add_library_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="parse one file and print its elements")
    p.add_argument("path", type=Path)
    p.add_argument("--json", action="store_true", help="print the ParsedDocument as JSON")
    p.add_argument("--password", help="password for an encrypted PDF")
    p.set_defaults(func=cmd_parse)

    c = sub.add_parser("chunk", help="parse one file and chunk it with a strategy")
    c.add_argument("path", type=Path)
    c.add_argument("--strategy", required=True, help="a strategy name from the chunking YAML")
    c.add_argument("--config", type=Path, help="chunking YAML (default: RAG_CHUNKING_CONFIG or config/chunking.yaml)")
    c.add_argument("--json", action="store_true", help="print the chunks as JSON")
    c.add_argument("--password", help="password for an encrypted PDF")
    c.set_defaults(func=cmd_chunk)

    i = sub.add_parser("index", help="parse → chunk → BM25 + embed a folder, without Dagster (same code as the assets)")
    i.add_argument("docs_dir", type=Path)
    i.add_argument("--strategy", action="append", help="chunking strategy (repeatable; default: all in the YAML)")
    i.add_argument("--model", action="append", help="embedding model (repeatable; default: minilm)")
    i.add_argument(
        "--sentence-encoder",
        choices=["model", "int8"],
        help="who encodes the sentence vectors answering reads (default: AnswerSettings.sentence_encoder's; answering "
        "must use the same, or it encodes sentences itself)",
    )
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_index)

    q = sub.add_parser("search", help="ranked chunks for a question")
    q.add_argument("query")
    q.add_argument("--strategy", required=True)
    # The defaults search what `rag serve` answers from: production's collection and the default retrieval mode.
    q.add_argument(
        "--model",
        default=SERVED_MODEL,
        help=f"embedder (default {SERVED_MODEL}: what serves, the base model until a promotion)",
    )
    q.add_argument(
        "--mode", default=DEFAULT_MODE, help=f"bm25 | dense | hybrid-rrf | hybrid-cc (default {DEFAULT_MODE})"
    )
    q.add_argument("--k", type=int, default=10)
    q.add_argument("--alpha", type=float, default=0.5, help="hybrid-cc weight of the dense score")
    q.add_argument("--mmr", type=float, metavar="LAMBDA", help="diversify with MMR (λ in [0, 1])")
    q.add_argument("--doc-id", action="append", help="only chunks of this document (repeatable)")
    q.add_argument("--pages", help="only chunks overlapping this page range, e.g. 2-5")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_search)

    e = sub.add_parser("eval-beir", help="index a BEIR dataset and score retrieval with ranx")
    e.add_argument("dataset_dir", type=Path)
    e.add_argument("--mode", default="dense")
    e.add_argument("--model", default="minilm")
    e.add_argument("--split", default="test")
    e.add_argument("--k", type=int, default=10)
    e.add_argument("--alpha", type=float, default=0.5)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_eval_beir)

    m = sub.add_parser(
        "migrate-engine",
        help="move an embedded Qdrant folder from qdrant-client's local mode to "
        "Qdrant Edge (the default engine), keeping the old folder beside it",
    )
    m.add_argument("--path", type=Path, default=None, help="the folder (default: RAG_QDRANT_PATH or <data dir>/qdrant)")
    m.set_defaults(func=cmd_migrate_engine)

    s = sub.add_parser("strategies", help="list the chunking strategies of the YAML file")
    s.add_argument("--config", type=Path)
    s.set_defaults(func=cmd_strategies)

    # Answers with citations (rag/qa/cli.py)
    from rag.qa.cli import add_ask_command

    add_ask_command(sub)

    # Gradual rollout of trained models (rag/rollout/cli.py)
    from rag.rollout.cli import add_models_command

    add_models_command(sub)

    # Retrain and the feedback export from the command line (rag/registry/cli.py)
    from rag.registry.cli import add_loop_commands

    add_loop_commands(sub)

    # Configuration search (rag/tuning/cli.py)
    from rag.tuning.cli import add_search_command

    add_search_command(sub)


def _parse(path: Path, password: str | None):
    settings = ParseSettings(pdf_passwords={path.name: password} if password else {})
    try:
        return parse_file(path, settings, doc_id=path.name)
    except ParseError as exc:
        print(
            json.dumps({"error": exc.reason.value, "exception_class": exc.exception_class, "message": exc.message}),
            file=sys.stderr,
        )
        raise SystemExit(2) from exc


def cmd_parse(args: argparse.Namespace) -> int:
    doc = _parse(args.path, args.password)
    if args.json:
        print(doc.model_dump_json(indent=2))
    else:
        print(
            f"{doc.doc_id}: {doc.n_pages} pages, {len(doc.elements)} elements, {doc.n_tables} tables, "
            f"{len(doc.canonical_text)} chars ({doc.parser})"
        )
        for e in doc.elements:
            print(f"  p{e.page} [{e.char_start}:{e.char_end}] {e.type}: {e.text[:90]!r}")
    return 0


def cmd_chunk(args: argparse.Namespace) -> int:
    from rag.chunking import chunk_document

    doc = _parse(args.path, args.password)
    chunks = chunk_document(doc, args.strategy, args.config)
    if args.json:
        print(json.dumps([c.model_dump() for c in chunks], indent=2, ensure_ascii=False))
    else:
        print(f"{doc.doc_id}: {len(chunks)} chunks with {args.strategy}")
        for c in chunks:
            print(
                f"  p{c.page_start}-{c.page_end} [{c.char_start}:{c.char_end}] {c.n_tokens} tok "
                f"{' > '.join(c.section_path)[:40]!r}: {c.text[:70]!r}"
            )
    return 0


def cmd_migrate_engine(args: argparse.Namespace) -> int:
    from rag.index.migrate import migrate_to_edge
    from rag.index.qdrant import QdrantSettings

    folder = args.path or Path(QdrantSettings.from_env().model_copy(update={"url": None}).location)
    try:
        migrate_to_edge(folder)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from rag.chunking import load_strategies, strategy_fingerprint

    for name, cfg in load_strategies(args.config).items():
        print(f"{name:24s} {cfg.kind:16s} {strategy_fingerprint(cfg)}  {cfg.params.model_dump(exclude_defaults=True)}")
    return 0


def _print(obj: dict | list, as_json: bool) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False, default=str) if as_json else _plain(obj))


def _plain(obj) -> str:
    if isinstance(obj, dict):
        return "\n".join(f"{k}: {v}" for k, v in obj.items())
    return "\n".join(str(x) for x in obj)


def _window_fits(root, collections: dict[str, dict]) -> dict[str, WindowFit]:
    """Per "strategy|model" collection: how its chunk set fits the model's window (models that state one)."""
    from rag.embedding import load_embedder, window_fit
    from rag.store import CHUNKS_TABLE, TableStore

    tables, fits = TableStore(root / "tables"), {}
    for name in collections:
        strategy, model = name.split("|", 1)
        fit = window_fit(load_embedder(model), tables.read(CHUNKS_TABLE, strategy)["text"].tolist())
        if fit is not None:
            fits[name] = fit
    return fits


def cmd_index(args: argparse.Namespace) -> int:
    from rag.pipeline import index_folder
    from rag.progress import cli_progress
    from rag.store import data_dir

    with cli_progress() as progress:
        report = index_folder(
            args.docs_dir,
            data_dir(),
            strategies=args.strategy,
            models=args.model or ["minilm"],
            progress=progress,
            sentence_encoder=args.sentence_encoder,
        )
    fits = _window_fits(data_dir(), report.collections)
    for name, fit in fits.items():
        report.collections[name] |= fit.summary
    out = {"parse": report.parse, "chunks": report.chunks, "bm25": report.bm25, "collections": report.collections}
    if args.json:
        _print(out, True)
    else:
        p = report.parse
        print(
            f"documents: {p['documents']} ({p['parsed']} parsed, {p['unchanged']} unchanged, {p['removed']} removed), "
            f"quarantined: {p['quarantined_total']}"
        )
        for strategy, c in report.chunks.items():
            for f in c["failures"]:
                print(
                    f"  chunking {strategy} failed for {f['doc_id']}: {f['error']} "
                    f"(kept its {f['kept_previous_chunks']} previous chunks; retried on the next run)",
                    file=sys.stderr,
                )
        for name, c in report.collections.items():
            print(f"  {name}: {c['points']} points (+{c['added']} ~{c['updated']} -{c['deleted']}) in {c['seconds']}s")
            if name in fits and (note := fits[name].message(name.split("|", 1)[0])):
                print(f"    note: {note}")
    return 0


def _page_range(text: str | None) -> tuple[int | None, int | None]:
    if not text:
        return None, None
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--pages expects N or N-M, got {text!r}") from None


def cmd_search(args: argparse.Namespace) -> int:
    from rag.retrieval import RetrievalParams, SearchFilter
    from rag.retrieval.service import search

    page_from, page_to = _page_range(args.pages)
    params = RetrievalParams(
        k=args.k,
        alpha=args.alpha,
        mmr_lambda=args.mmr,
        filters=SearchFilter(doc_ids=args.doc_id, page_from=page_from, page_to=page_to),
    )
    hits = search(args.query, strategy=args.strategy, model=args.model, mode=args.mode, k=args.k, params=params)
    if args.json:
        print(json.dumps([h.to_json() for h in hits], indent=2, ensure_ascii=False))
    else:
        for h in hits:
            j = h.to_json()
            print(
                f"{j['rank']:3d}. {j['score']:.4f} {j['doc_id']} p{j['page_start']}-{j['page_end']} "
                f"[{j['char_start']}:{j['char_end']}] {j['text'][:100]!r}"
            )
    return 0


def cmd_eval_beir(args: argparse.Namespace) -> int:
    from rag.evaluation.beir import evaluate_beir
    from rag.progress import cli_progress
    from rag.retrieval import RetrievalParams
    from rag.store import data_dir

    with cli_progress() as progress:
        result = evaluate_beir(
            args.dataset_dir,
            mode=args.mode,
            model=args.model,
            split=args.split,
            k=args.k,
            root=data_dir() / "beir",
            params=RetrievalParams(alpha=args.alpha),
            progress=progress,
        )
    _print(result, args.json)
    return 0


def run_command(func, args: argparse.Namespace) -> int:
    """Run a command; expected failures print one clear line to stderr and exit 2, never a traceback.
    Libraries' known noise (rag.quiet) is silenced first; other warnings and errors still show."""
    from rag.index.qdrant import QdrantLockedError
    from rag.quiet import quiet_known_noise

    quiet_known_noise()

    try:
        return func(args)
    except (ValueError, FileNotFoundError, QdrantLockedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
