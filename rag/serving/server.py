"""`rag serve`: the API and web page over the data dir's index, with the feedback store beside it."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.canary import CanaryRouter
from rag.serving.configured import ConfiguredServing
from rag.serving.index import ServingIndex, refresh_forever
from rag.serving.residency import MAPPED_PAGES_MB
from rag.serving.sessions import SessionKeys
from rag.serving.settings import ServeSettings
from rag.store import data_dir

log = logging.getLogger(__name__)


def answer_settings(settings: ServeSettings, **overrides):
    from rag.qa import AnswerSettings

    base = AnswerSettings.from_yaml(settings.answer_config) if settings.answer_config else AnswerSettings()
    return base.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def pinned_fields(settings: ServeSettings, **overrides) -> frozenset[str]:
    """The answer settings an operator gave explicitly (command line, answer config file): a production
    configuration never overrides them."""
    import yaml

    given = {k for k, v in overrides.items() if v is not None}
    if settings.answer_config:
        given |= set(yaml.safe_load(Path(settings.answer_config).read_text()) or {})
    return frozenset(given)


def serving_index(
    answer,
    *,
    root: Path,
    lock_wait_seconds: float = 120.0,
    mapped_pages_mb: float | None = MAPPED_PAGES_MB,
    drop_copy_from_cache: bool = True,
) -> ServingIndex:
    """A ServingIndex that builds rag.qa Answerers over (a replica of) the configured index; `mapped_pages_mb`:
    rag.serving.residency's budget (None: unbounded); `drop_copy_from_cache`: see ServingIndex."""
    from rag.qa import Answerer
    from rag.retrieval import DENSE_MODES
    from rag.retrieval.service import open_index

    def opened(qdrant):
        return open_index(
            answer.strategy,
            answer.model,
            root=root,
            qdrant=qdrant,
            need_dense=answer.mode in DENSE_MODES,
            need_bm25=answer.mode in {"bm25", "hybrid-rrf", "hybrid-cc"},
            query_encoder=answer.query_encoder,
        )

    def build(index):
        answerer = Answerer(answer, root=root, index=index)
        answerer.warm_reranker_in_background()  # long-lived: its first requests should cost what later ones do
        return answerer

    dense = answer.mode in DENSE_MODES
    return ServingIndex(
        root=root,
        strategy=answer.strategy,
        model=answer.model if dense else None,
        build=build,
        open_index=opened,
        lock_wait_seconds=lock_wait_seconds,
        mapped_pages_mb=mapped_pages_mb,
        drop_copy_from_cache=drop_copy_from_cache,
    )


class RerankerArm:
    """A reranker candidate's arm: production's current answerer with the candidate reranker in its place (same
    index, embedder, LLM and attribution), rebuilt when production's answerer is replaced."""

    def __init__(self, production: Callable[[], object], candidate: str, root: Path):
        from rag.qa.pipeline import load_reranker_spec

        self.production, self.name, self.root = production, candidate, root
        self.reranker = load_reranker_spec(candidate, root)  # fails here, not on a request, when it cannot load
        self._for = self._answerer = None

    def current(self):
        from rag.qa import Answerer

        production = self.production()
        if production is not self._for:
            self._answerer = Answerer(
                production.settings.model_copy(update={"reranker": self.name}),
                production.llm,
                root=self.root,
                index=production.index,
                reranker=self.reranker,
                attribution_scorer=production.attribution_scorer,
                embedder=production.embedder,
            )
            self._answerer.warm_reranker_in_background()  # the candidate's first timed requests: not cold
            self._for = production
        return self._answerer

    def close(self) -> None:
        self._for = self._answerer = None


def canary_router(serving, *, root: Path, mapped_pages_mb: float | None = MAPPED_PAGES_MB) -> CanaryRouter:
    """The router of `rag serve`: an embedder candidate is served from a replica of its own collection
    (<strategy>__<name>, built when the canary started), a reranker candidate over production's index, a
    configuration candidate from the index of its chunk set with its retrieval settings. `serving`: a
    ConfiguredServing (its settings() are what production answers with now)."""
    from rag.registry import ModelRegistry
    from rag.retrieval import DENSE_MODES
    from rag.training.configuration import FOLLOWED, ServingConfiguration

    def refuses(kind: str, state) -> str | None:
        answer = serving.settings()
        if kind == "embedder":
            if answer.mode not in DENSE_MODES:
                return f"retrieval mode {answer.mode!r} uses no embedder"
            if answer.model != "production":
                return (
                    f"the API serves embedding model {answer.model!r}, not 'production': serve with --model production "
                    "(what promotion swaps) to compare the candidate with production"
                )
        elif kind == "configuration":
            fixed = sorted(set(FOLLOWED) & serving.pinned)
            if fixed:
                # Once promoted, a configuration this server does not follow would never reach its users.
                return (
                    f"the API pins {', '.join(fixed)} (given on the command line or in the answer config): serve "
                    "without them to follow the production configuration"
                )
        elif answer.reranker != "production":
            # Even before the first reranker promotion: a server without `reranker: production` would not serve the
            # candidate once it is promoted, so its users' clicks would judge a ranking they will never get.
            return (
                f"the API serves reranker {answer.reranker!r}, not 'production': set `reranker: production` in the "
                "answer config (retrieval order until a reranker is promoted)"
            )
        return None

    def open_arm(kind: str, candidate):
        if kind == "reranker":
            return RerankerArm(serving.current, candidate.name, root)
        answer = serving.settings()
        if kind == "configuration":
            candidate_settings = ServingConfiguration.load(candidate.path).apply(answer)
        else:
            candidate_settings = answer.model_copy(update={"model": candidate.name})
        # Short lock wait: while a Dagster run holds the embedded folder, production answers canary sessions (outside
        # the comparison) and the open is retried a minute later, instead of a request waiting two minutes.
        return serving_index(candidate_settings, root=root, lock_wait_seconds=5.0, mapped_pages_mb=mapped_pages_mb)

    return CanaryRouter(ModelRegistry(root / "models"), open_arm, refuses)


def recover_lifecycle(root: Path, lock_wait_seconds: float = 120.0, wait: bool = True) -> str | None:
    """Finish (or undo) a promotion or rollback a killed process left unfinished, before anything is served: the
    registry, the serving aliases and the rollout state then agree. Qdrant is opened only when that transaction
    swaps serving aliases (and released before the serving replica is taken). `wait=False`: LifecycleBusy while
    another process is promoting now."""
    import time

    from rag.index.qdrant import QdrantLockedError, QdrantSettings
    from rag.lifecycle.journal import pending, recover
    from rag.registry import ModelRegistry

    registry = ModelRegistry(root / "models")
    if pending(registry) is None:
        return None
    qdrant = QdrantSettings.from_env()
    deadline = time.monotonic() + lock_wait_seconds
    while True:
        with contextlib.ExitStack() as opened:
            try:
                return recover(registry, lambda: _primary(qdrant, opened), log=log.warning, wait=wait)
            except QdrantLockedError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(2)


def _primary(qdrant, opened: contextlib.ExitStack):
    """The primary Qdrant's client. An embedded folder is borrowed, so its lock goes back to Dagster afterwards
    without closing it under a replica copy of the refresh loop; a server's client stays (the answerer uses it)."""
    from rag.index.qdrant import borrowed_client, get_client

    return get_client(qdrant) if qdrant.url else opened.enter_context(borrowed_client(qdrant))


def recover_while_serving(root: Path) -> None:
    """The refresh loop's recovery: a promotion killed while this server runs is completed (or undone) here too,
    and the refresh that follows serves the outcome, instead of split aliases until a restart. It never waits: a
    live promotion finishes on its own, and a Qdrant folder held by a re-index is tried again on the next tick."""
    from rag.index.qdrant import QdrantLockedError
    from rag.lifecycle.journal import LifecycleBusy

    try:
        recover_lifecycle(root, lock_wait_seconds=0, wait=False)
    except (LifecycleBusy, QdrantLockedError) as exc:
        log.info("an unfinished promotion is not recovered yet (%s): tried again on the next refresh", exc)


def build_app(
    settings: ServeSettings, *, root: Path | None = None, store: FeedbackStore | None = None, **answer_overrides
):
    """The production app: Answerer over a serving replica, refreshed in the background, and the feedback store."""
    root = Path(root or data_dir())
    answer = answer_settings(settings, **answer_overrides)
    recover_lifecycle(root)
    serving = ConfiguredServing(
        answer,
        root=root,
        open_serving=lambda wanted: serving_index(wanted, root=root, mapped_pages_mb=settings.mapped_pages_mb),
        pinned=pinned_fields(settings, **answer_overrides),
    )
    router = canary_router(serving, root=root, mapped_pages_mb=settings.mapped_pages_mb)
    store = store or FeedbackStore(root=root)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(_app):
        if settings.refresh_seconds > 0:
            # The canary's index follows the rollout state and its own re-index; production's refresh recovers first.
            for target, before in ((serving, lambda: recover_while_serving(root)), (router, None)):
                threading.Thread(
                    target=refresh_forever, args=(target, settings.refresh_seconds, stop, before), daemon=True
                ).start()
        yield
        stop.set()
        router.close()
        serving.close()
        store.close()

    def health() -> dict:
        # Resolved from the answerer serving now (rebuilt when a promotion moves an alias), not from the settings:
        # "production" names an alias, and the versions behind it are what an operator checks after a promotion.
        current = serving.current()
        served = current.served() if hasattr(current, "served") else {}
        return {"index": serving.info(), "served": {**served, "config": str(settings.answer_config or "defaults")}}

    # Keys every replica over this data dir shares (or RAG_SESSION_SECRET): a session keeps its arm on all of them.
    sessions = SessionKeys.for_data_dir(root)
    app = create_app(serving.current, store, settings, canary=router, health_extra=health, root=root, sessions=sessions)
    app.router.lifespan_context = lifespan
    app.state.serving = serving
    return app


def serve(settings: ServeSettings, **answer_overrides) -> None:
    import uvicorn

    logging.basicConfig(level=logging.INFO)
    app = build_app(settings, **answer_overrides)
    served = app.state.serving.current().served()
    print(
        f"answering with embedder {served['embedder'] or 'none'}, reranker {served['reranker']}, "
        f"mode {served['mode']}, chunk set {served['strategy']} (GET /health names them after a promotion swaps "
        "them in)",
        flush=True,
    )
    print(f"web page: http://{settings.host}:{settings.port}/#token={settings.api_token}", flush=True)
    print(
        f"API: POST /ask, /feedback, /events with `Authorization: Bearer {settings.api_token}`; "
        f"schema at http://{settings.host}:{settings.port}/openapi.json",
        flush=True,
    )
    # A separate token: whoever holds the user token must not be able to write the labels training trusts most.
    print(
        f"expert view (label the annotation queue): http://{settings.host}:{settings.port}/expert#token="
        f"{settings.expert_token} (RAG_EXPERT_TOKEN)",
        flush=True,
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
