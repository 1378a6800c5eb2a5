"""How `rag serve` runs: token, limits, what it answers with, how often it looks for a re-built index."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import BaseModel, Field


class ServeSettings(BaseModel):
    api_token: str = Field(min_length=16, description="bearer token for POST /ask, /feedback, /events and GET /metrics")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="bigger requests get 413 before they are parsed")
    ask_concurrency: int = Field(1, ge=1, description="answers computed at once (the CPU is the limit; others queue)")
    answer_config: Path | None = Field(None, description="YAML of rag.qa.AnswerSettings; None = the defaults")
    refresh_seconds: float = Field(30.0, ge=0, description="how often to look for a re-built index (0 = never)")
    metrics_cache_seconds: float = Field(30.0, ge=0, description="GET /metrics counts the store's tables at most this "
                                         "often (each count scans a table); 0 = on every call")

    @classmethod
    def from_env(cls, **overrides) -> ServeSettings:
        """RAG_API_TOKEN (a random one when unset: `rag serve` prints it), RAG_ANSWER_CONFIG (default: the active
        configuration when one was applied), RAG_SERVE_REFRESH_SECONDS."""
        token = os.environ.get("RAG_API_TOKEN")
        if token is not None and len(token) < 16:
            raise ValueError("RAG_API_TOKEN must be at least 16 characters (or unset it for a random one)")
        from rag.tuning.active import active_file

        # Without an explicit config the API serves the active configuration (an applied search winner), if any.
        env = {"api_token": token or secrets.token_urlsafe(24), "answer_config": os.environ.get("RAG_ANSWER_CONFIG") or active_file()}
        if os.environ.get("RAG_SERVE_REFRESH_SECONDS"):
            env["refresh_seconds"] = float(os.environ["RAG_SERVE_REFRESH_SECONDS"])
        return cls(**{**env, **{k: v for k, v in overrides.items() if v is not None}})
