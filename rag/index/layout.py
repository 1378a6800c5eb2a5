"""How a new collection is laid out: which of its parts stay in RAM and which are read from disk, whether its dense
vectors are kept int8-quantized, and on a Qdrant server or cluster how it is sharded and replicated.

Nothing set (the default) keeps every engine's own defaults, what collections were built with before. Read from a
YAML file of these fields named by RAG_QDRANT_LAYOUT (config/qdrant/ holds the sizes docs/indexes.md recommends for
1M, 10M and 100M chunks), then from one variable per field, RAG_QDRANT_<FIELD> (e.g. RAG_QDRANT_VECTORS_ON_DISK=1),
which wins. A layout takes effect when a collection is built (a new model version, a first index, `rag index` on a
fresh data dir); a collection keeps the layout it was built with, and serving replicas copy it.

The embedded engine (Qdrant Edge) takes the placement and quantization settings; shards, replication factor and write
consistency exist only on a server, so an embedded engine leaves them out with a warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

LAYOUT_FILE_ENV = "RAG_QDRANT_LAYOUT"
SERVER_ONLY = ("shards", "replication_factor", "write_consistency_factor")


def _env_name(field: str) -> str:
    return f"RAG_QDRANT_{field.upper()}"


class CollectionLayout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A server's shard_number: a collection split over this many shards (spread over a cluster's nodes).
    shards: int | None = Field(None, ge=1)
    # A server's copies of each shard: a node can fail without losing a shard or its searches.
    replication_factor: int | None = Field(None, ge=1)
    # A server's replicas that must acknowledge a write before it succeeds (at most replication_factor).
    write_consistency_factor: int | None = Field(None, ge=1)
    # Dense vectors memory-mapped from disk instead of held in RAM: a search reads the pages it visits.
    vectors_on_disk: bool | None = None
    # Payloads (the chunk records searches read per hit) on disk, read per point.
    payload_on_disk: bool | None = None
    # The BM25 sparse vectors' inverted index on disk (Edge keeps it in RAM by default).
    sparse_on_disk: bool | None = None
    # The HNSW graph on disk.
    hnsw_on_disk: bool | None = None
    # The payload indexes (the document and page fields searches filter by) read from disk, not rebuilt in RAM at
    # every open: held in RAM they are a replica's heap that grows with the corpus (docs/indexes.md).
    payload_indexes_on_disk: bool | None = None
    # "int8": a scalar-quantized copy of the dense vectors (a quarter of float32) that searches score first, the
    # originals rescoring the best; "none" keeps float32 only.
    quantization: Literal["none", "int8"] = "none"
    quantile: float | None = Field(None, ge=0.5, le=1.0)  # of the values the int8 range covers (Qdrant's default 0.99)
    # The quantized copy pinned in RAM even when the originals are on disk (the usual pairing).
    quantization_always_ram: bool | None = None

    @classmethod
    def from_env(cls) -> CollectionLayout:
        values: dict[str, Any] = {}
        path = os.environ.get(LAYOUT_FILE_ENV)
        if path:
            values.update(_read_file(Path(path)))
        for name, info in cls.model_fields.items():
            raw = os.environ.get(_env_name(name))
            if raw is None or raw.strip() == "":
                continue
            values[name] = _parse(name, raw, info.annotation)
        return cls(**values)

    @classmethod
    def from_file(cls, path: Path) -> CollectionLayout:
        return cls(**_read_file(Path(path)))

    def server_options(self) -> dict[str, int]:
        """qdrant-client create_collection's arguments that only a server takes."""
        names = {"shards": "shard_number"}
        return {names.get(k, k): getattr(self, k) for k in SERVER_ONLY if getattr(self, k) is not None}

    def vector_params(self, dim: int, distance):
        from qdrant_client import models

        return models.VectorParams(size=dim, distance=distance, on_disk=self.vectors_on_disk)

    def quantization_config(self):
        from qdrant_client import models

        if self.quantization == "none":
            return None
        return models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(
                type=models.ScalarType.INT8, quantile=self.quantile, always_ram=self.quantization_always_ram
            )
        )

    def create_options(self, *, server: bool) -> dict[str, Any]:
        """create_collection's arguments for this layout beyond the vectors' own (an engine's default left out)."""
        options: dict[str, Any] = {}
        if self.payload_on_disk is not None:
            options["on_disk_payload"] = self.payload_on_disk
        if (quantization := self.quantization_config()) is not None:
            options["quantization_config"] = quantization
        server_only = self.server_options()
        if server:
            options.update(server_only)
        elif server_only:
            log.warning(
                "%s apply to a Qdrant server only: this embedded collection is one shard in one process "
                "(unset them, or point QDRANT_URL at a server)",
                ", ".join(_env_name(k) for k in SERVER_ONLY if getattr(self, k) is not None),
            )
        return options


def _read_file(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ValueError(f"{LAYOUT_FILE_ENV}={path}: no such file (config/qdrant/ holds examples)")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        fields = ", ".join(CollectionLayout.model_fields)
        raise ValueError(f"{path}: give a mapping of collection layout fields ({fields})")
    return data


def _parse(name: str, raw: str, annotation) -> Any:
    text = raw.strip().lower()
    kinds = set(get_args(annotation)) or {annotation}
    if bool in kinds:
        if text not in {"0", "1", "true", "false", "yes", "no"}:
            raise ValueError(f"{_env_name(name)}={raw!r}: give 1 or 0")
        return text in {"1", "true", "yes"}
    if int in kinds or float in kinds:
        try:
            return int(text) if int in kinds else float(text)
        except ValueError:
            raise ValueError(f"{_env_name(name)}={raw!r}: give a number, or unset it") from None
    return text  # a choice (quantization): the model says which values it takes
