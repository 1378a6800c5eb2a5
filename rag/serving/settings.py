"""How `rag serve` runs: token, limits, what it answers with, how often it looks for a re-built index."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from rag.serving.residency import MAPPED_PAGES_MB


class ServeSettings(BaseModel):
    api_token: str = Field(min_length=16, description="bearer token for POST /ask, /feedback, /events and GET /metrics")
    expert_token: str = Field(
        default_factory=lambda: secrets.token_urlsafe(24),
        min_length=16,
        description="bearer token of the expert view and /annotation/*: only it writes expert "
        "labels (the api token cannot); random unless given",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="bigger requests get 413 before they are parsed")
    # Two at once: while one answer waits in onnxruntime or SQLite (both release the GIL), the other runs; the
    # engine's searches and the Python around them hold the GIL, so more would only queue. Exploratory 30-45 s runs
    # of `bench/load_api.py --ask-concurrency 1|2` on 2 cores gave 10 clients about 38 requests/s one at a time and
    # 35-49 (noisy) two at once; the committed run with this default is bench/results/load-api.json.
    ask_concurrency: int = Field(
        default_factory=lambda: min(2, os.cpu_count() or 1),
        ge=1,
        description="answers computed at once (the CPU is the limit; others queue); RAG_ASK_CONCURRENCY",
    )
    answer_config: Path | None = Field(None, description="YAML of rag.qa.AnswerSettings; None = the defaults")
    refresh_seconds: float = Field(30.0, ge=0, description="how often to look for a re-built index (0 = never)")
    # Behind a proxy that authenticates users, every user shares the proxy's address: a canary would then bound all
    # of them as one client. Only a header the proxy itself sets (and strips from what clients send) may name them.
    client_header: str | None = Field(
        None,
        description="request header that names the client (set by a trusted proxy, e.g. X-Forwarded-User); "
        "None: the peer address. A canary bounds what one client adds to its evidence; RAG_CLIENT_HEADER",
    )
    metrics_cache_seconds: float = Field(
        30.0,
        ge=0,
        description="GET /metrics counts the store's tables at most this "
        "often (each count scans a table); 0 = on every call",
    )
    # rag.serving.corrected: why agreement and the documents, not a client's word, decide what is served back.
    corrected_answers_min_clients: int = Field(
        2,
        ge=0,
        description="a question asked again is answered with a correction this many different clients wrote, "
        "when a passage retrieved for it holds that answer; 0 = never; RAG_CORRECTED_ANSWERS_MIN_CLIENTS",
    )
    # rag.serving.residency: why a replica unmaps its collection's pages, and why that costs no disk read.
    mapped_pages_mb: float | None = Field(
        MAPPED_PAGES_MB,
        ge=0,
        description="mapped file pages (MB, the model's and libraries' included) above which a replica unmaps its "
        "collection's before the next question; a replica copy bigger than it leaves the page cache once made; "
        "None = neither; RAG_SERVE_MAPPED_MB ('off')",
    )
    corrections_cache_seconds: float = Field(
        30.0, ge=0, description="how often /ask re-reads the corrections people wrote; 0 = on every question"
    )

    @model_validator(mode="after")
    def _tokens_differ(self) -> ServeSettings:
        if self.expert_token == self.api_token:
            raise ValueError(
                "the expert token must differ from the api token, or every user could write expert labels: "
                "set RAG_EXPERT_TOKEN to another value (or unset it for a random one)"
            )
        return self

    @classmethod
    def from_env(cls, **overrides) -> ServeSettings:
        """RAG_API_TOKEN and RAG_EXPERT_TOKEN (random ones when unset: `rag serve` prints them), RAG_ANSWER_CONFIG
        (default: the active configuration when one was applied), RAG_SERVE_REFRESH_SECONDS, RAG_ASK_CONCURRENCY,
        RAG_CLIENT_HEADER, RAG_CORRECTED_ANSWERS_MIN_CLIENTS, RAG_SERVE_MAPPED_MB."""
        tokens = {}
        for field, name in (("api_token", "RAG_API_TOKEN"), ("expert_token", "RAG_EXPERT_TOKEN")):
            token = os.environ.get(name)
            if token is not None and len(token) < 16:
                raise ValueError(f"{name} must be at least 16 characters (or unset it for a random one)")
            tokens[field] = token or secrets.token_urlsafe(24)
        from rag.tuning.active import active_file

        # Without an explicit config the API serves the active configuration (an applied search winner), if any.
        env = {**tokens, "answer_config": os.environ.get("RAG_ANSWER_CONFIG") or active_file()}
        if os.environ.get("RAG_SERVE_REFRESH_SECONDS"):
            env["refresh_seconds"] = float(os.environ["RAG_SERVE_REFRESH_SECONDS"])
        if os.environ.get("RAG_ASK_CONCURRENCY"):
            env["ask_concurrency"] = int(os.environ["RAG_ASK_CONCURRENCY"])
        if os.environ.get("RAG_CORRECTED_ANSWERS_MIN_CLIENTS"):
            env["corrected_answers_min_clients"] = int(os.environ["RAG_CORRECTED_ANSWERS_MIN_CLIENTS"])
        if os.environ.get("RAG_CLIENT_HEADER"):
            env["client_header"] = os.environ["RAG_CLIENT_HEADER"]
        if os.environ.get("RAG_SERVE_MAPPED_MB"):
            mapped = os.environ["RAG_SERVE_MAPPED_MB"].strip().lower()
            try:
                env["mapped_pages_mb"] = None if mapped == "off" else float(mapped)
            except ValueError:
                raise ValueError(f"RAG_SERVE_MAPPED_MB must be a number of MB or 'off', not {mapped!r}") from None
        return cls(**{**env, **{k: v for k, v in overrides.items() if v is not None}})
