"""The HTTP API and the web pages: POST /ask, POST /feedback, POST /events, GET /health, GET /metrics, GET /; a
passage's context and its document: GET /passages/{chunk_id}/context, GET /documents/{doc_id}; the expert view:
GET /expert, GET /annotation/next, POST /annotation/labels, POST /annotation/undo.

    app = create_app(lambda: answerer, FeedbackStore(), ServeSettings(api_token="..."), root=data_dir())

The answerer comes from a provider called per request, so the server can swap in a fresh index (see
rag.serving.index) without restarting; tests pass a fake one. Write endpoints and /metrics need the bearer token;
/annotation/* needs the expert token (the user token gets 403: experts' labels are graded judgments that
training trusts more than ratings). The annotation queue is read from `root` (rag.annotation.queue), and so is the
parsed_documents table that a passage's context and its document's file are found from.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import mimetypes
import re
import threading
import time
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Protocol
from urllib.parse import quote

import numpy as np
import pyarrow.parquet as pq
from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag.annotation.queue import AnnotationQueue, QueueItem, queue_path, read_queue
from rag.feedback import (
    ExpertAck,
    ExpertLabel,
    ExpertUndo,
    FeedbackAck,
    FeedbackError,
    FeedbackStore,
    FeedbackSubmission,
    ImplicitEvent,
)
from rag.feedback.models import MAX_EXPERT_CHARS
from rag.retrieval import MAX_QUERY_CHARS, RetrievalError
from rag.retrieval.chunks import ChunkLookup, lookup_of
from rag.serving.corrected import CorrectedAnswers
from rag.serving.sessions import COOKIE, Session, SessionKeys
from rag.serving.settings import ServeSettings
from rag.source import resolve_inside
from rag.store import DOCUMENTS_TABLE, TableStore, data_dir

STATIC = Path(__file__).parent / "static"


class Asker(Protocol):
    def ask(self, question: str): ...  # -> rag.qa.AnswerResult


def _visible(text: str) -> bool:
    """Whether text holds anything a person can read: zero-width and other format characters, controls and
    separators alone are as empty as spaces."""
    return any(unicodedata.category(ch)[0] not in "CZ" for ch in text)


def askable(question: str) -> str:
    """A question worth retrieving for: the 422 says what is wrong and what to do (the web page shows it as is), and
    the length limit is the retriever's own, so the two cannot disagree."""
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (JSON allows "\udc00") is no text: the tokenizer and the store would fail on it later.
        raise PydanticCustomError(
            "invalid_text",
            "the question holds characters that are not valid Unicode text (a lone surrogate): fix its encoding",
        ) from None
    if not _visible(question):
        raise PydanticCustomError(
            "blank_question", "the question is empty or only spaces or invisible characters: write a question"
        )
    if len(question) > MAX_QUERY_CHARS:
        raise PydanticCustomError(
            "question_too_long",
            "the question is {length} characters; the limit is {limit}: shorten it",
            {"length": f"{len(question):,}", "limit": f"{MAX_QUERY_CHARS:,}"},
        )
    return question


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: Annotated[str, AfterValidator(askable)] = Field(json_schema_extra={"maxLength": MAX_QUERY_CHARS})
    session_id: str | None = Field(
        None, max_length=128, description="the client's own label of its session (kept with the query)"
    )
    session: str | None = Field(
        None,
        max_length=128,
        description="the session token a previous /ask returned (or the rag_session cookie): without a valid one "
        "/ask starts a new session",
    )


class Passage(BaseModel):
    chunk_id: str
    doc_id: str
    page_start: int
    page_end: int
    text: str
    rank: int
    score: float | None
    cited: bool
    attributed: bool = False


class AskResponse(BaseModel):
    query_id: str
    answer_id: str
    question: str
    answer: str
    not_in_context: bool
    cited_chunk_ids: list[str]
    passages: list[Passage]
    latency_ms: float
    model_version: str | None
    session: str = Field(
        description="this session's token: send it back as `session` with later /ask, /feedback and /events "
        "requests (the page keeps it in the rag_session cookie too)"
    )
    warnings: list[str] = []  # degraded paths this answer took (e.g. attribution fell back to embeddings)
    timings_ms: dict[str, float] = {}  # per answer stage: retrieve, rerank, generate, attribute, total (or overview)


class EventAck(BaseModel):
    event_id: int


class AnnotationProgress(BaseModel):
    total: int = Field(description="items in the current queue")
    labelled: int = Field(description="queue items with a label (given at any time, by anyone)")
    labelled_since_queue: int = Field(description="queue items labelled since the queue was built")
    by_you: int = Field(description="queue items whose label is the asking expert's")


class AnnotationBatch(BaseModel):
    queue_created_at: datetime
    strategy: str
    selection: str
    items: list[QueueItem] = Field(description="the next unlabelled items, most useful first")
    progress: AnnotationProgress


class NoQueueError(StarletteHTTPException):
    def __init__(self, root: Path):
        super().__init__(
            409, f"no annotation queue yet: materialize the `annotation_queue` asset (it writes {queue_path(root)})"
        )


class InvalidQueueError(StarletteHTTPException):
    def __init__(self, root: Path, exc: Exception):
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        super().__init__(
            503,
            f"the annotation queue {queue_path(root)} cannot be read ({type(exc).__name__}: {first}): materialize the "
            "`annotation_queue` asset again to rebuild it; labels already given are kept",
        )


class QueueFile:
    """The annotation queue of a data dir, read again only when its file changes (the asset replaces it atomically,
    so a new mtime or size is a new queue): GET /annotation/next must not parse the JSON on every label."""

    def __init__(self, root: Callable[[], Path]):
        self.root = root
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._queue: AnnotationQueue | None = None
        self._items: dict[str, QueueItem] = {}

    def get(self) -> tuple[AnnotationQueue, dict[str, QueueItem]]:
        """The queue and its items by id; NoQueueError (409) when none was built."""
        root = Path(self.root())
        try:
            stat = queue_path(root).stat()
        except FileNotFoundError:
            raise NoQueueError(root) from None
        with self._lock:
            seen = (str(root), stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                try:
                    queue = read_queue(root)
                except (ValueError, ValidationError, OSError) as exc:  # json's errors are ValueErrors
                    raise InvalidQueueError(root, exc) from None
                if queue is None:  # removed between the stat and the read
                    raise NoQueueError(root)
                self._queue, self._items, self._seen = queue, {item.item_id: item for item in queue.items}, seen
            return self._queue, self._items


CONTEXT_CHARS = 800  # most of the document shown on either side of a passage
DOCUMENT_LINK_SECONDS = 3600  # how long a document link from a passage's context opens the file
DOCUMENT_TEXTS_KEPT = 8  # documents whose text stays in memory: a reader clicks through one answer's passages
CHUNK_ID = r"^[\w.:@-]+$"  # chunk ids are hex digests (rag.chunking.spans.chunk_id); tests' ids are words


class PassageContext(BaseModel):
    chunk_id: str
    doc_id: str
    page_start: int
    page_end: int
    before: str = Field(description=f"the document's text just before the passage (at most {CONTEXT_CHARS} characters)")
    text: str = Field(description="the passage as served")
    after: str = Field(description=f"the document's text just after the passage (at most {CONTEXT_CHARS} characters)")
    exact: bool = Field(
        description="before and after are the document's own text; false: pieced from the neighbouring passages, "
        "as the document's stored text no longer matches the served chunk set (re-parsed since) or is missing"
    )
    document_url: str | None = Field(
        description=f"opens the source file (a PDF at the passage's page, #page=N) without a bearer token for "
        f"{DOCUMENT_LINK_SECONDS // 60} minutes; null when the file is not available"
    )


class DocumentTable:
    """The parsed_documents table of a data dir as the passage routes read it: each document's source file from two
    small columns, read again only when the table file changes; one document's text at a time (its row alone), the
    last few kept."""

    def __init__(self, root: Callable[[], Path]):
        self.root = root
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._sources: dict[str, str] = {}
        self._texts: OrderedDict[tuple, str | None] = OrderedDict()

    def _current(self) -> tuple[Path, tuple] | None:
        path = TableStore(Path(self.root()) / "tables").path(DOCUMENTS_TABLE)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return path, (str(path), stat.st_mtime_ns, stat.st_size)

    def source(self, doc_id: str) -> str | None:
        """The path the document was parsed from (None: no such parsed document)."""
        current = self._current()
        if current is None:
            return None
        path, seen = current
        with self._lock:
            if seen != self._seen:
                table = pq.read_table(path, columns=["doc_id", "source_path"])
                self._sources = dict(zip(table.column(0).to_pylist(), table.column(1).to_pylist()))
                self._seen = seen
            return self._sources.get(doc_id)

    def text(self, doc_id: str) -> str | None:
        """The document's canonical text as last parsed (None: not in the table)."""
        current = self._current()
        if current is None:
            return None
        path, seen = current
        key = (seen, doc_id)  # a new table file is a new key: what an older one held ages out of the cache
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
                return self._texts[key]
        rows = pq.read_table(path, columns=["canonical_text"], filters=[("doc_id", "==", doc_id)]).column(0)
        text = rows[0].as_py() if len(rows) else None
        with self._lock:
            self._texts[key] = text
            while len(self._texts) > DOCUMENT_TEXTS_KEPT:
                self._texts.popitem(last=False)
        return text


def document_file(source_path: str, doc_id: str) -> Path:
    """The file of `doc_id` under the folder it was scanned from (its source_path is that folder joined with the
    doc_id). LookupError: the source path does not end with the doc_id (a document that came from no folder);
    ValueError: the doc_id now resolves outside that folder (a symlink put in its place)."""
    source, parts = Path(source_path), PurePosixPath(doc_id).parts
    if not parts or source.parts[-len(parts) :] != parts:
        raise LookupError(f"{doc_id!r} was not parsed from a document folder (its source was {source_path!r})")
    return resolve_inside(Path(*source.parts[: -len(parts)]), doc_id)


def _clip_start(text: str, limit: int) -> str:
    """The last `limit` characters of text, from a word's start when cut."""
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    space = re.search(r"\s", cut)
    return cut[space.end() :] if space else cut


def _clip_end(text: str, limit: int) -> str:
    """The first `limit` characters of text, up to a word's end when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    return cut[:space] if space > 0 else cut


def chunk_row(chunks: ChunkLookup, chunk_id) -> dict | None:
    """The record of a chunk id in the served chunk records (read per chunk), None when they hold none."""
    if not isinstance(chunk_id, str):
        return None
    return chunks.get_many([chunk_id]).get(chunk_id)


def context_of(passage: dict, chunks: ChunkLookup, document: str | None) -> tuple[str, str, bool]:
    """(before, after, exact): the document's text around the passage when its stored text still holds the passage
    where the chunk set says (offsets into the text as parsed when the chunks were made); else the neighbouring
    passages' text (the served index is the one consistent source: the document may have been re-parsed since)."""
    start, end = int(passage["char_start"]), int(passage["char_end"])
    if document is not None and document[start:end] == passage["text"]:
        return _clip_start(document[:start], CONTEXT_CHARS), _clip_end(document[end:], CONTEXT_CHARS), True
    before = after = ""
    if (prev := chunk_row(chunks, passage.get("prev_chunk_id"))) is not None:
        before = prev["text"][: max(0, start - int(prev["char_start"]))]
    if (nxt := chunk_row(chunks, passage.get("next_chunk_id"))) is not None:
        after = nxt["text"][max(0, end - int(nxt["char_start"])) :]
    return _clip_start(before, CONTEXT_CHARS), _clip_end(after, CONTEXT_CHARS), False


def link_signature(token: str, doc_id: str, expires: int) -> str:
    """What a document link carries instead of the bearer token (a link the browser follows sends no header):
    keyed by the API token, so only its holders can make one, and a new token voids every link."""
    mac = hmac.new(token.encode("utf-8"), f"document\x1f{doc_id}\x1f{expires}".encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()[:32]


def document_headers(path: Path) -> dict[str, str]:
    """A document is the corpus's content, not this app's: an HTML or SVG file must not run scripts in the page's
    origin (where the token is kept), so anything but a PDF (the browser's viewer needs no scripts of the file and
    does not run in a sandbox) is sandboxed. no-referrer keeps the signed link from leaking through its links."""
    headers = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "private"}
    if path.suffix.lower() != ".pdf":
        headers["Content-Security-Policy"] = "sandbox"
    return headers


def model_version(answerer) -> str | None:
    """Embedding model name and weights version behind an answerer (None when it has no dense index)."""
    embedder = getattr(getattr(answerer, "index", None), "embedder", None) or getattr(answerer, "embedder", None)
    if embedder is None:
        return getattr(answerer, "model_version", None)
    return f"{embedder.name}@{embedder.version}"


class _Measure:
    """Counts every routed request's status and latency into `metrics` (/metrics itself aside). Plain ASGI: Starlette's
    @app.middleware("http") wraps each request in a task group and streams, a millisecond or more per request."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except Exception:
            # An unhandled error propagates past this middleware (Starlette's outermost handler turns it into the
            # 500): count it here, or /metrics would never show a server error.
            status = 500
            raise
        finally:
            route = scope.get("route")  # set by the router on the shared scope once a route matched
            if route is not None and scope.get("path") != "/metrics":
                self.metrics.observe(f"{scope['method']} {route.path}", status, time.perf_counter() - started)


class _BodyLimit:
    """Refuses bodies over the limit with 413 before anything parses them (declared or streamed length)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # a streamed body without a length: FastAPI turns this into the 413 reply
                raise StarletteHTTPException(413, self.message)
            return message

        await self.app(scope, limited_receive, send)

    @property
    def message(self) -> str:
        return f"request body over {self.max_bytes:,} bytes"

    async def _refuse(self, send):
        response = JSONResponse({"error": self.message}, status_code=413)
        await response({"type": "http"}, None, send)


_monotonic = time.monotonic  # module-level, so a test can move the clock of the store counts' cache


class CachedCounts:
    """The store's row counts, counted at most once per `seconds`: each count is a scan of a whole table (SQLite
    keeps no row count), and a scraper polling /metrics every few seconds would otherwise scan them all each time.
    One caller counts while concurrent ones wait and reuse its result; 0 seconds counts on every call."""

    def __init__(self, count: Callable[[], dict], seconds: float):
        self.count, self.seconds = count, seconds
        self._lock = threading.Lock()
        self._value: dict | None = None
        self._at = 0.0

    def get(self) -> tuple[dict, float]:
        """(the counts, how many seconds ago they were counted)."""
        with self._lock:
            if self._value is None or _monotonic() - self._at >= self.seconds:
                self._value, self._at = self.count(), _monotonic()
            return self._value, _monotonic() - self._at


STAGE_WINDOW = 1000  # answers whose stage times /metrics summarises


class Metrics:
    """Request counts, errors and latency per route (the last 10k requests of each); /ask's time per answer stage
    (the last STAGE_WINDOW answers)."""

    def __init__(self):
        self.started = time.time()
        self._lock = threading.Lock()
        self._latency: dict[str, deque] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self._stages: dict[str, deque] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._latency.setdefault(route, deque(maxlen=10_000)).append(seconds * 1000)
            counts = self._counts.setdefault(route, {"count": 0, "4xx": 0, "5xx": 0})
            counts["count"] += 1
            if status >= 500:
                counts["5xx"] += 1
            elif status >= 400:
                counts["4xx"] += 1

    def observe_stages(self, timings: dict[str, float]) -> None:
        """One /ask's stage times (AnswerResult.timings_ms), kept for the last STAGE_WINDOW answers."""
        with self._lock:
            for stage, ms in timings.items():
                self._stages.setdefault(stage, deque(maxlen=STAGE_WINDOW)).append(float(ms))

    def stage_snapshot(self) -> dict:
        with self._lock:
            return {
                stage: {
                    "n": len(ms),
                    "p50_ms": round(float(np.percentile(ms, 50)), 2),
                    "p95_ms": round(float(np.percentile(ms, 95)), 2),
                }
                for stage, ms in self._stages.items()
                if ms
            }

    def snapshot(self) -> dict:
        with self._lock:
            out = {}
            for route, counts in self._counts.items():
                ms = np.asarray(self._latency[route])
                out[route] = {
                    **counts,
                    "p50_ms": round(float(np.percentile(ms, 50)), 2),
                    "p95_ms": round(float(np.percentile(ms, 95)), 2),
                }
            return out


def create_app(
    answerer_provider: Callable[[], Asker],
    store: FeedbackStore,
    settings: ServeSettings,
    *,
    health_extra: Callable[[], dict] | None = None,
    canary=None,
    root: Path | None = None,
    sessions: SessionKeys | None = None,
) -> FastAPI:
    """`canary`: a rag.serving.canary.CanaryRouter; while a canary runs it picks each session's arm and answers
    canary sessions from interleaved rankings. None: production answers everything (no arm is recorded).
    `root`: the data dir holding the annotation queue (None: rag.store.data_dir(), looked up per request).
    `sessions`: the keys sessions are issued and verified with (rag.serving.sessions); None: this process's own."""
    app = FastAPI(
        title="Document QA",
        version="1",
        description="Ask questions about the indexed documents and rate "
        "the answers and passages; ratings train the next models.",
        docs_url=None,
        redoc_url=None,
    )
    metrics = Metrics()
    store_counts = CachedCounts(store.counts, settings.metrics_cache_seconds)
    corrected = CorrectedAnswers(
        store.corrections, settings.corrected_answers_min_clients, settings.corrections_cache_seconds
    )
    ask_slots = asyncio.Semaphore(settings.ask_concurrency)
    bearer = HTTPBearer(auto_error=False)
    queue_file = QueueFile(lambda: root or data_dir())
    documents = DocumentTable(lambda: root or data_dir())
    sessions = sessions or SessionKeys.random()

    def client_of(request: Request) -> str:
        """Where a request came from: the header a trusted proxy sets (ServeSettings.client_header), else the peer
        address (uvicorn already reads X-Forwarded-For from the proxies FORWARDED_ALLOW_IPS trusts)."""
        if settings.client_header:
            named = request.headers.get(settings.client_header)
            if named:
                return f"header:{named}"
        return f"peer:{request.client.host if request.client else 'unknown'}"

    def session_of(request: Request, token: str | None) -> Session:
        return sessions.session(token or request.cookies.get(COOKIE))

    def verified(request: Request, token: str | None) -> str | None:
        return sessions.verify(token or request.cookies.get(COOKIE))

    def given(credentials: HTTPAuthorizationCredentials | None, token: str) -> bool:
        return credentials is not None and hmac.compare_digest(credentials.credentials.encode(), token.encode())

    def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not given(credentials, settings.api_token):
            raise StarletteHTTPException(
                401,
                "missing or wrong bearer token: send `Authorization: Bearer <token>` "
                "(the token `rag serve` printed, or RAG_API_TOKEN)",
            )

    def require_expert(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if given(credentials, settings.expert_token):
            return
        if given(credentials, settings.api_token):
            raise StarletteHTTPException(
                403,
                "expert labels need the expert token, not the user token: send "
                "`Authorization: Bearer <expert token>` (printed by `rag serve`, or "
                "RAG_EXPERT_TOKEN)",
            )
        raise StarletteHTTPException(
            401,
            "missing or wrong bearer token: the expert view needs `Authorization: Bearer "
            "<expert token>` (the expert token `rag serve` printed, or RAG_EXPERT_TOKEN)",
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(FeedbackError)
    async def _feedback_error(_request: Request, exc: FeedbackError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RetrievalError)
    async def _retrieval_error(_request: Request, exc: RetrievalError):
        return JSONResponse({"error": str(exc)}, status_code=422)

    @app.post(
        "/ask",
        response_model=AskResponse,
        dependencies=[Depends(require_token)],
        summary="Answer a question from the documents and record it for feedback",
    )
    async def ask(body: AskRequest, request: Request, response: Response) -> AskResponse:
        session = session_of(request, body.session)
        client_key = sessions.client_key(client_of(request))
        # Waiting for a slot happens on the event loop, not in a worker thread: queued questions must not take
        # the threads that /feedback and /health are served from.
        async with ask_slots:
            answerer = answerer_provider()
            if canary is None:
                result = await run_in_threadpool(answerer.ask, body.question)
                arm, version = None, model_version(answerer)
            else:
                served = await run_in_threadpool(
                    canary.answer, answerer, body.question, sessions.arm_key(session.session_id)
                )
                result, arm, version = served.result, served.arm, served.model_version
            result = await run_in_threadpool(corrected.apply, result)
        stored = await run_in_threadpool(
            store.record_query,
            result.question,
            answer=result.answer,
            chunks=result.chunks,
            session_id=body.session_id or session.session_id,
            model_version=version,
            settings=result.settings,
            latency_ms=result.latency_ms,
            not_in_context=result.not_in_context,
            arm=arm,
            timings_ms=getattr(result, "timings_ms", None) or None,
            client_session=session.session_id,
            client_key=client_key,
        )
        if session.new:
            response.set_cookie(COOKIE, session.token, httponly=True, samesite="strict")
        # total: what the answer took as a whole (a canary's latency also covers the second arm's ranking)
        timings = {**(getattr(result, "timings_ms", None) or {}), "total": result.latency_ms}
        metrics.observe_stages(timings)
        return AskResponse(
            query_id=stored.query_id,
            answer_id=stored.answer_id,
            question=result.question,
            answer=result.answer,
            not_in_context=result.not_in_context,
            cited_chunk_ids=result.cited_chunk_ids,
            latency_ms=result.latency_ms,
            model_version=version,
            session=session.token,
            warnings=getattr(result, "warnings", []),
            timings_ms=timings,
            passages=[Passage(**{k: c.get(k) for k in Passage.model_fields if k in c}) for c in result.chunks],
        )

    @app.post(
        "/feedback",
        response_model=FeedbackAck,
        dependencies=[Depends(require_token)],
        summary="Rate an answer (+1/-1), its passages, or correct it; idempotent per idempotency_key",
        responses={
            201: {"model": FeedbackAck},
            404: {"description": "unknown query_id"},
            409: {"description": "idempotency key reused for other feedback"},
        },
    )
    def feedback(body: FeedbackSubmission, request: Request):
        ack = store.submit_feedback(body, client_session=verified(request, body.session))
        return JSONResponse(ack.model_dump(), status_code=200 if ack.duplicate else 201)

    @app.post(
        "/events",
        response_model=EventAck,
        dependencies=[Depends(require_token)],
        summary="Record an implicit signal (a passage was opened); idempotent per idempotency_key",
        responses={
            404: {"description": "unknown query_id"},
            409: {"description": "idempotency key reused for another event"},
        },
    )
    def events(body: ImplicitEvent, request: Request) -> EventAck:
        return EventAck(event_id=store.record_event(body, client_session=verified(request, body.session)))

    def served_chunks() -> ChunkLookup:
        """The chunk records of the index answering now (what /ask's passages come from)."""
        chunks = lookup_of(getattr(answerer_provider(), "index", None))
        if chunks is None:
            raise StarletteHTTPException(
                404, "this server answers without a passage index, so no passage has a context here"
            )
        return chunks

    def document_url(doc_id: str, page: int) -> str | None:
        """A signed link to the document's file (None when it cannot be served); a PDF opens at `page`."""
        source = documents.source(doc_id)
        try:
            path = None if source is None else document_file(source, doc_id)
        except (LookupError, ValueError):
            return None
        if path is None or not path.is_file():
            return None
        expires = int(time.time()) + DOCUMENT_LINK_SECONDS
        signature = link_signature(settings.api_token, doc_id, expires)
        fragment = f"#page={page}" if path.suffix.lower() == ".pdf" else ""
        return f"/documents/{quote(doc_id, safe='/')}?expires={expires}&signature={signature}{fragment}"

    def require_document_access(
        doc_id: str,
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
        expires: Annotated[int | None, Query(description="a signed link's expiry (Unix seconds)")] = None,
        signature: Annotated[str | None, Query(max_length=64, description="a signed link's signature")] = None,
    ) -> None:
        if given(credentials, settings.api_token):
            return
        if expires is None or signature is None:
            require_token(credentials)  # neither a token nor a link: the bearer token's 401
        if not hmac.compare_digest(signature, link_signature(settings.api_token, doc_id, expires)):
            raise StarletteHTTPException(
                401, "the document link's signature is wrong: open it from a passage's context on the page again"
            )
        if expires < time.time():
            raise StarletteHTTPException(
                401, "the document link has expired: click the passage on the page again for a fresh link"
            )

    @app.get(
        "/passages/{chunk_id}/context",
        response_model=PassageContext,
        dependencies=[Depends(require_token)],
        summary="A served passage in its document: the text before and after it, its pages, a link to the file",
        responses={404: {"description": "the passage is not in the chunk set that serves now"}},
    )
    def passage_context(
        chunk_id: Annotated[str, PathParam(min_length=1, max_length=128, pattern=CHUNK_ID)],
    ) -> PassageContext:
        chunks = served_chunks()
        row = chunk_row(chunks, chunk_id)
        if row is None:
            raise StarletteHTTPException(
                404,
                f"passage {chunk_id!r} is not in the chunk set that serves now (it may have been re-indexed since "
                "the answer): ask the question again",
            )
        doc_id = str(row["doc_id"])
        before, after, exact = context_of(row, chunks, documents.text(doc_id))
        return PassageContext(
            chunk_id=chunk_id,
            doc_id=doc_id,
            page_start=int(row["page_start"]),
            page_end=int(row["page_end"]),
            before=before,
            text=str(row["text"]),
            after=after,
            exact=exact,
            document_url=document_url(doc_id, int(row["page_start"])),
        )

    @app.get(
        "/documents/{doc_id:path}",
        dependencies=[Depends(require_document_access)],
        summary="The original file of a parsed document, from the folder it was parsed from; the bearer token or "
        "a signed link from /passages/{chunk_id}/context",
        response_class=FileResponse,
        responses={
            403: {"description": "the document's path now leads outside its document folder"},
            404: {"description": "no parsed document has this id, or its file is gone"},
        },
    )
    def document(doc_id: Annotated[str, PathParam(min_length=1, max_length=1024)]) -> FileResponse:
        source = documents.source(doc_id)
        if source is None:
            raise StarletteHTTPException(
                404, f"no parsed document {doc_id!r}: use the doc_id of a passage /ask returned"
            )
        try:
            path = document_file(source, doc_id)
        except LookupError as exc:
            raise StarletteHTTPException(404, f"{exc}: there is no file to open") from None
        except ValueError:
            raise StarletteHTTPException(
                403, f"refused: {doc_id!r} now leads outside the document folder it was parsed from"
            ) from None
        if not path.is_file():
            raise StarletteHTTPException(
                404, f"{doc_id!r} was parsed from {path}, which is no longer there: re-index the document folder"
            )
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        headers = document_headers(path)
        return FileResponse(
            path, media_type=media, filename=path.name, content_disposition_type="inline", headers=headers
        )

    @app.get("/health", summary="Liveness and what is being served")
    def health() -> dict:
        store.high_water_mark()  # fails loudly when the store is unreachable
        return {
            "status": "ok",
            "store": store.engine.dialect.name,
            **(health_extra() if health_extra else {}),
            **({"canary": canary.info()} if canary is not None else {}),
        }

    @app.get(
        "/metrics",
        dependencies=[Depends(require_token)],
        summary="Store counts (refreshed every metrics_cache_seconds), request latency per route and /ask's "
        "time per answer stage",
    )
    def get_metrics() -> dict:
        """Behind the API token, as the write routes: the store counts and per-route traffic say how the service is
        used, and an open route that scans tables is a cheap way to load the database. /health stays open for
        liveness probes. `store_counted_s_ago` says how old the cached counts are."""
        counts, age = store_counts.get()
        return {
            "uptime_s": round(time.time() - metrics.started, 1),
            "store": counts,
            "store_counted_s_ago": round(age, 1),
            "requests": metrics.snapshot(),
            "ask_stages": metrics.stage_snapshot(),
        }

    @app.get(
        "/annotation/next",
        response_model=AnnotationBatch,
        dependencies=[Depends(require_expert)],
        summary="The next unlabelled items of the annotation queue, and how far the labelling is",
    )
    def annotation_next(
        expert: Annotated[
            str, Query(min_length=1, max_length=MAX_EXPERT_CHARS, description="who asks (counts `by_you`)")
        ],
        limit: Annotated[int, Query(ge=1, le=100)] = 1,
    ) -> AnnotationBatch:
        queue, _items = queue_file.get()
        labelled = store.current_expert_labels()
        ids = [item.item_id for item in queue.items]
        done = store.expert_progress(ids, since=queue.created_at, expert=expert.strip())
        return AnnotationBatch(
            queue_created_at=queue.created_at,
            strategy=queue.strategy,
            selection=queue.selection,
            items=[item for item in queue.items if item.item_id not in labelled][:limit],
            progress=AnnotationProgress(
                total=done["total"],
                labelled=done["labelled"],
                labelled_since_queue=done["labelled_since"],
                by_you=done["by_expert"],
            ),
        )

    @app.post(
        "/annotation/labels",
        response_model=ExpertAck,
        dependencies=[Depends(require_expert)],
        summary="Grade an item of the annotation queue: 2 relevant, 1 partially, 0 irrelevant; idempotent",
        responses={
            201: {"model": ExpertAck},
            404: {"description": "the item is not in the current queue"},
            409: {"description": "no queue yet, or the idempotency key was used for another label"},
        },
    )
    def annotation_label(body: ExpertLabel):
        replay = store.expert_replay(body)  # a retry is answered even when a refresh has dropped its item since
        if replay is None:
            _queue, items = queue_file.get()
            item = items.get(body.item_id)
            if item is None:
                raise StarletteHTTPException(
                    404,
                    f"item {body.item_id!r} is not in the current annotation queue (it "
                    "may have been rebuilt): take the items GET /annotation/next returns",
                )
            replay = store.record_expert_label(
                body, question=item.question, passage=item.model_dump(), query_id=item.query_id
            )
        return JSONResponse(replay.model_dump(), status_code=200 if replay.duplicate else 201)

    @app.post(
        "/annotation/undo",
        response_model=ExpertAck,
        dependencies=[Depends(require_expert)],
        summary="Retract your current label of an item (it is unlabelled again); idempotent",
        responses={409: {"description": "nothing to undo (no label, or another expert's)"}},
    )
    def annotation_undo(body: ExpertUndo):
        ack = store.undo_expert_label(body)
        return JSONResponse(ack.model_dump(), status_code=200 if ack.duplicate else 201)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/expert", include_in_schema=False)
    def expert_page() -> FileResponse:
        return FileResponse(STATIC / "expert.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(_Measure, metrics=metrics)
    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes)
    return app
