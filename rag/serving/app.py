"""The HTTP API and the web pages: POST /ask, POST /feedback, POST /events, GET /health, GET /metrics, GET /; the
expert view: GET /expert, GET /annotation/next, POST /annotation/labels, POST /annotation/undo.

    app = create_app(lambda: answerer, FeedbackStore(), ServeSettings(api_token="..."), root=data_dir())

The answerer comes from a provider called per request, so the server can swap in a fresh index (see
rag.serving.index) without restarting; tests pass a fake one. Write endpoints and /metrics need the bearer token;
/annotation/* needs the expert token (the user token gets 403: experts' labels are graded judgments that
training trusts more than ratings). The annotation queue is read from `root` (rag.annotation.queue).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Protocol

import numpy as np
from fastapi import Depends, FastAPI, Query, Request, Response
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
from rag.serving.sessions import COOKIE, Session, SessionKeys
from rag.serving.settings import ServeSettings
from rag.store import data_dir

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
    ask_slots = asyncio.Semaphore(settings.ask_concurrency)
    bearer = HTTPBearer(auto_error=False)
    queue_file = QueueFile(lambda: root or data_dir())
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
