"""`rag serve` arguments; the server and its libraries are imported only when the command runs."""

from __future__ import annotations

from pathlib import Path


def add_serve_command(sub) -> None:
    """`rag serve`: registered by the `rag` entry point."""
    p = sub.add_parser("serve", help="HTTP API and web page: ask, rate answers and passages (feedback store)")
    p.add_argument("--host", default=None, help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default 8000")
    p.add_argument("--strategy", default=None, help="chunk set to answer from (default: the answer config's)")
    p.add_argument(
        "--model",
        default=None,
        help="embedding model of the dense index (default: the answer config's, "
        "else production: what a promotion swaps, the base minilm until then)",
    )
    p.add_argument("--mode", default=None, help="retrieval mode (default: the answer config's, else hybrid-cc)")
    p.add_argument(
        "--reranker",
        default=None,
        help="production (what a promotion swaps; retrieval order until the "
        "first reranker is promoted), none, or a registered version (default: the answer config's, else "
        "production)",
    )
    p.add_argument("--answer-config", type=Path, default=None, help="YAML of AnswerSettings (or RAG_ANSWER_CONFIG)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from rag.serving.server import serve
    from rag.serving.settings import ServeSettings

    settings = ServeSettings.from_env(host=args.host, port=args.port, answer_config=args.answer_config)
    serve(settings, strategy=args.strategy, model=args.model, mode=args.mode, reranker=args.reranker)
    return 0
