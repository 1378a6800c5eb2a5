"""Library commands that run without Dagster: `rag parse` and `rag chunk` (for debugging and harnesses)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rag.parsing import ParseError, ParseSettings, parse_file


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

    s = sub.add_parser("strategies", help="list the chunking strategies of the YAML file")
    s.add_argument("--config", type=Path)
    s.set_defaults(func=cmd_strategies)


def _parse(path: Path, password: str | None):
    settings = ParseSettings(pdf_passwords={path.name: password} if password else {})
    try:
        return parse_file(path, settings, doc_id=path.name)
    except ParseError as exc:
        print(json.dumps({"error": exc.reason.value, "exception_class": exc.exception_class, "message": exc.message}), file=sys.stderr)
        raise SystemExit(2) from exc


def cmd_parse(args: argparse.Namespace) -> int:
    doc = _parse(args.path, args.password)
    if args.json:
        print(doc.model_dump_json(indent=2))
    else:
        print(f"{doc.doc_id}: {doc.n_pages} pages, {len(doc.elements)} elements, {doc.n_tables} tables, {len(doc.canonical_text)} chars ({doc.parser})")
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
            print(f"  p{c.page_start}-{c.page_end} [{c.char_start}:{c.char_end}] {c.n_tokens} tok {' > '.join(c.section_path)[:40]!r}: {c.text[:70]!r}")
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from rag.chunking import load_strategies, strategy_fingerprint

    for name, cfg in load_strategies(args.config).items():
        print(f"{name:24s} {cfg.kind:16s} {strategy_fingerprint(cfg)}  {cfg.params.model_dump(exclude_defaults=True)}")
    return 0
