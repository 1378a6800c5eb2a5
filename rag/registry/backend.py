"""MLflow behind the model registry: where its store is, a client for it, and the migrated empty database a new
embedded store starts from.

Embedded (the default): `sqlite:///<registry root>/mlflow.db`, run artifacts under `<registry root>/mlartifacts`,
nothing leaves the machine. `MLFLOW_TRACKING_URI` (and optionally `MLFLOW_REGISTRY_URI`) point it at a team server.

mlflow is imported only here and only when a registry first talks to its store: the import takes seconds, and most
processes that construct a ModelRegistry (sensors, `rag ask` before any training) never need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from pydantic import BaseModel, Field

DB_NAME = "mlflow.db"
ARTIFACTS = "mlartifacts"
# One registered model and one experiment per kind; the versions of `rag-embedder` are ft-<family>-vN.
MODEL_NAME = {"embedder": "rag-embedder", "reranker": "rag-reranker", "configuration": "rag-configuration"}
EXPERIMENT = {
    "embedder": "rag-embedder-training",
    "reranker": "rag-reranker-training",
    "configuration": "rag-configuration-training",
}
DESCRIPTION = (
    "Versions trained by rag (rag.registry): aliases production / candidate; in embedded mode each "
    "version's weights and manifest.json are the folder its source names"
)
# What `make mlflow` serves: the address run links point at in embedded mode unless UI_URL_ENV names another.
LOCAL_UI = "http://127.0.0.1:5000"
UI_URL_ENV = "RAG_MLFLOW_UI_URL"
# Bump when what the template database holds changes (today: the three registered models), so caches rebuild.
TEMPLATE_FORMAT = 3

# Set before mlflow is first imported (setdefault: an operator's own value wins). Telemetry off: embedded mode must
# never reach the network; WARNING: MLflow's INFO lines (migrations, "created version") would flood CLI output;
# no progress bars in logs.
ENV_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


class MlflowSettings(BaseModel):
    """Where the registry's MLflow lives. Both None: embedded in the registry root."""

    tracking_uri: str | None = Field(
        None,
        description="MLFLOW_TRACKING_URI: a team server (http://host:5000) or a "
        "database URL; None keeps runs and versions in <registry root>/mlflow.db",
    )
    registry_uri: str | None = Field(
        None,
        description="MLFLOW_REGISTRY_URI: where registered versions live when not "
        "beside the runs (default: the tracking URI)",
    )

    @classmethod
    def from_env(cls) -> MlflowSettings:
        return cls(
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
            registry_uri=os.environ.get("MLFLOW_REGISTRY_URI") or None,
        )

    @property
    def embedded(self) -> bool:
        return self.tracking_uri is None and self.registry_uri is None

    def uris(self, root: Path) -> tuple[str, str]:
        tracking = self.tracking_uri or f"sqlite:///{Path(root).resolve() / DB_NAME}"
        return tracking, self.registry_uri or tracking


def ui_url(tracking_uri: str, embedded: bool) -> str | None:
    """Where people open this store's MLflow UI (no trailing slash): RAG_MLFLOW_UI_URL when set (a proxy, another
    port), else the tracking server itself for an http(s) MLFLOW_TRACKING_URI, else `make mlflow`'s address for the
    embedded store; None for a database URL with no UI named (nothing to link to)."""
    named = os.environ.get(UI_URL_ENV, "").strip()
    if named:
        return named.rstrip("/")
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI if embedded else None


def mlflow_module():
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import mlflow

    if (
        "MLFLOW_LOGGING_LEVEL" not in os.environ
        or os.environ["MLFLOW_LOGGING_LEVEL"] == ENV_DEFAULTS["MLFLOW_LOGGING_LEVEL"]
    ):
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # also when something imported mlflow before this
    _cache_schema_head()
    return mlflow


def _cache_schema_head() -> None:
    """Opening a SQL store compares its schema with the newest migration, which MLflow finds by loading every
    migration script again (about 45 ms, twice per store: runs and registry). The answer is fixed for the installed
    MLflow, and each test and data dir opens its own store: asked once per process. Left alone if MLflow renames it."""
    import functools

    from mlflow.store.db import utils

    current = getattr(utils, "_get_latest_schema_revision", None)
    if current is not None and not hasattr(current, "cache_info"):
        utils._get_latest_schema_revision = functools.cache(current)


def not_found(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST"


def already_exists(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) == "RESOURCE_ALREADY_EXISTS"


_clients: dict[tuple[str, str], object] = {}
_clients_lock = threading.Lock()


def client(tracking_uri: str, registry_uri: str):
    """One MlflowClient per store and process (MLflow caches the store behind it; opening one verifies the schema)."""
    with _clients_lock:
        found = _clients.get((tracking_uri, registry_uri))
        if found is None:
            found = mlflow_module().MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
            _clients[(tracking_uri, registry_uri)] = found
        return found


def ensure_registered_models(mlflow_client) -> None:
    """A team server's store does not start from the template."""
    for name in MODEL_NAME.values():
        try:
            mlflow_client.create_registered_model(name, description=DESCRIPTION)
        except Exception as exc:  # noqa: BLE001 - MlflowException; only "already there" is expected
            if not already_exists(exc):
                raise


def _cache_dirs() -> list[Path]:
    """Where the template may live: the user's cache, else the temp dir (a read-only home on CI)."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rag-pipeline"
    return [user, Path(tempfile.gettempdir()) / f"rag-pipeline-{os.getuid()}"]


def template_db() -> Path:
    """A migrated empty store with the registered models, built once per user and MLflow version.

    A fresh SQLite store runs every MLflow migration (seconds); copying this file takes milliseconds, so each
    registry root (every test's tmp dir, every data dir) starts from a copy. Built in a temp file and renamed into
    place, so concurrent builders each finish with a whole file."""
    mlflow = mlflow_module()
    name = f"mlflow-{mlflow.__version__}-template{TEMPLATE_FORMAT}.db"
    error: OSError | None = None
    for cache in _cache_dirs():
        path = cache / name
        if path.exists():
            return path
        try:
            cache.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=".build-", suffix=".db")
        except OSError as exc:
            error = exc
            continue
        os.close(fd)
        os.unlink(tmp)  # SQLite creates it
        try:
            _build(tmp)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path
    raise error


def _build(path: str) -> None:
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    uri = f"sqlite:///{path}"
    # The Default experiment MLflow creates points into wherever the template was built: it is deleted, so no run
    # of a registry root ever lands outside it (rag's runs go to the per-kind experiments).
    tracking = TrackingStore(uri, Path(path).with_suffix(".artifacts").as_uri())
    tracking.delete_experiment("0")
    registry = RegistryStore(uri)
    for name in MODEL_NAME.values():
        registry.create_registered_model(name, description=DESCRIPTION)
    for store in (tracking, registry):
        store.engine.dispose()
    # WAL: readers (serving, sensors, the CLI) and the one writer holding the registry lock do not block each other;
    # in the default rollback journal a reader's open transaction makes an alias move wait and retry.
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")


def create_embedded_store(db: Path) -> None:
    """Put a copy of the template at `db` (callers hold the registry lock); falls back to migrating in place when
    the user cache cannot be written."""
    try:
        source = template_db()
    except OSError:
        source = None
    fd, tmp = tempfile.mkstemp(dir=db.parent, prefix=".tmp-", suffix=".db")
    os.close(fd)
    try:
        if source is not None:
            shutil.copyfile(source, tmp)
        else:
            os.unlink(tmp)
            _build(tmp)
        os.replace(tmp, db)
    finally:
        Path(tmp).unlink(missing_ok=True)


_KEY = re.compile(r"[^\w\-. :/]")


def key(name: str) -> str:
    """A metric, param or tag name MLflow accepts: ndcg@10 -> ndcg_at_10."""
    return _KEY.sub("_", str(name).replace("@", "_at_"))
