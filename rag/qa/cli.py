"""`rag ask "QUESTION" [--config FILE] [--json]`: an answer with its sources (document, pages)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_ask_command(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("ask", help="answer a question from the indexed documents, with citations")
    a.add_argument("question")
    a.add_argument(
        "--config",
        type=Path,
        help="YAML of AnswerSettings fields (see README, 'Asking questions'); default: "
        "the active configuration (<data dir>/active_configuration.yaml) when one was applied",
    )
    a.add_argument("--strategy", help="chunk set (default: paragraph)")
    a.add_argument(
        "--model",
        help="embedding model (default: production, the promoted embedder; the base minilm until one is promoted)",
    )
    a.add_argument(
        "--mode",
        help="none | bm25 | dense | hybrid-rrf | hybrid-cc (default: the active configuration's, else hybrid-cc)",
    )
    a.add_argument(
        "--reranker",
        help="production | none | a registered version or a model directory (default: "
        "production, the promoted reranker; retrieval order until one is promoted)",
    )
    a.add_argument("--generator", choices=["extractive", "llm"], help="default: extractive (no LLM needed)")
    a.add_argument("--top-k", type=int, help="passages given to the generator (default: 5)")
    a.add_argument("--json", action="store_true", help="print the whole AnswerResult as JSON")
    a.set_defaults(func=cmd_ask)


def cmd_ask(args: argparse.Namespace) -> int:
    from rag.llm import LLMError
    from rag.qa import AnswerSettings, answer_question

    from rag.tuning.active import active_file

    # The configuration a search winner was applied to is what serves queries, unless the user names another.
    config = args.config or active_file()
    settings = AnswerSettings.from_yaml(config) if config else AnswerSettings()
    overrides = {
        k: v
        for k, v in {
            "strategy": args.strategy,
            "model": args.model,
            "mode": args.mode,
            "reranker": args.reranker,
            "generator": args.generator,
            "top_k": args.top_k,
        }.items()
        if v is not None
    }
    settings = AnswerSettings(**(settings.model_dump() | overrides))
    if not args.config:  # as rag serve: the production configuration, where the user named nothing else
        import yaml

        from rag.registry import ModelRegistry
        from rag.store import data_dir
        from rag.training.configuration import served_settings

        pinned = set(overrides) | set((yaml.safe_load(config.read_text()) or {}) if config else {})
        settings = served_settings(settings, ModelRegistry(data_dir() / "models"), pinned)
    try:
        result = answer_question(args.question, settings)
    except LLMError as exc:
        raise ValueError(f"the LLM failed: {exc}") from exc
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, ensure_ascii=False))
        return 0
    print(result.answer)
    for src in result.sources():
        how = " + ".join(k for k in ("cited", "attributed") if src[k])
        pages = f"p{src['page_start']}" + (f"-{src['page_end']}" if src["page_end"] != src["page_start"] else "")
        print(f"  - {src['doc_id']} {pages} ({how}) [{src['chunk_id'][:12]}]")
    served = result.served
    print(
        f"({result.generator}, {result.latency_ms:.0f} ms; embedder {served.get('embedder') or 'none'}, reranker "
        f"{served.get('reranker') or 'none'}, {served.get('mode')})"
    )
    return 0
