"""`rag serve`: the API and web page over the data dir's index, with the feedback store beside it."""
from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager
from pathlib import Path

from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.index import ServingIndex, refresh_forever
from rag.serving.settings import ServeSettings
from rag.store import data_dir


def answer_settings(settings: ServeSettings, **overrides):
    from rag.qa import AnswerSettings

    base = AnswerSettings.from_yaml(settings.answer_config) if settings.answer_config else AnswerSettings()
    return base.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def serving_index(answer, *, root: Path) -> ServingIndex:
    """A ServingIndex that builds rag.qa Answerers over (a replica of) the configured index."""
    from rag.qa import Answerer
    from rag.retrieval import DENSE_MODES
    from rag.retrieval.service import open_index

    def opened(qdrant):
        return open_index(answer.strategy, answer.model, root=root, qdrant=qdrant, need_dense=answer.mode in DENSE_MODES,
                          need_bm25=answer.mode in {"bm25", "hybrid-rrf", "hybrid-cc"})

    dense = answer.mode in DENSE_MODES
    return ServingIndex(root=root, strategy=answer.strategy, model=answer.model if dense else None,
                        build=lambda index: Answerer(answer, root=root, index=index), open_index=opened)


def build_app(settings: ServeSettings, *, root: Path | None = None, store: FeedbackStore | None = None, **answer_overrides):
    """The production app: Answerer over a serving replica, refreshed in the background, and the feedback store."""
    root = Path(root or data_dir())
    serving = serving_index(answer_settings(settings, **answer_overrides), root=root)
    store = store or FeedbackStore(root=root)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(_app):
        worker = None
        if settings.refresh_seconds > 0:
            worker = threading.Thread(target=refresh_forever, args=(serving, settings.refresh_seconds, stop), daemon=True)
            worker.start()
        yield
        stop.set()
        serving.close()
        store.close()

    app = create_app(serving.current, store, settings, health_extra=lambda: {"index": serving.info()})
    app.router.lifespan_context = lifespan
    app.state.serving = serving
    return app


def serve(settings: ServeSettings, **answer_overrides) -> None:
    import uvicorn

    logging.basicConfig(level=logging.INFO)
    app = build_app(settings, **answer_overrides)
    print(f"web page: http://{settings.host}:{settings.port}/#token={settings.api_token}", flush=True)
    print(f"API: POST /ask, /feedback, /events with `Authorization: Bearer {settings.api_token}`; "
          f"schema at http://{settings.host}:{settings.port}/openapi.json", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")

