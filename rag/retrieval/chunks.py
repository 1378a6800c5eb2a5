"""Where a search reads its hits' chunk records: the chunk set's table in memory, or the collection's payloads.

Every point of a collection carries its chunk's record as payload (rag.index.sync.PAYLOAD_FIELDS), so a search that
opens a collection can read what it returns from the engine, a few records per question, instead of holding the whole
chunk set in memory: about 2.1 KB per chunk, 21 GB per serving replica at 10M chunks. Both lookups answer the same
calls, so retrieval, the answer stage and the web page have one code path:

- `TableChunks`: a chunk table indexed by chunk_id (what evaluations, training and tests build in memory, and what
  searches without a collection read: bm25-only over the bm25s index). Point ids map to chunk ids through a dict
  built from the table on first use, so searches ask the engine for ids only.
- `PayloadChunks`: the collection behind an alias. Searches rank point ids (no payload read beside a score), fuse
  them, and read the records of the top k only, so memory and reads are bounded by what a question returns: two
  searches of 100 candidates read k records, not 200 payloads. The collection is the one consistent source: the
  text served is the text that was embedded, and a replica needs neither the chunk table nor a shared disk (a Qdrant
  server's payload reaches every replica).

Inside retrieval a ranking is keyed by its lookup's own key (`ranking`, `key`): the chunk id for TableChunks, the
point id for PayloadChunks; `read` gives the records of keys, `chunk_ids` only their chunk ids.

rag.retrieval.service.open_index picks PayloadChunks whenever it opens a collection (RAG_CHUNKS=auto, the default;
`table` keeps the old way, `engine` insists on the payloads).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from rag.index.qdrant import point_id
from rag.index.sync import PAYLOAD_FIELDS

if TYPE_CHECKING:
    from rag.qa.overview import Catalog
    from rag.retrieval import SearchFilter

# A chunk record's payload fields (the engine's own, the BM25 length, left out), in the chunk table's column order.
RECORD_FIELDS = tuple(PAYLOAD_FIELDS)
READ_BATCH = 1024  # point ids per retrieve: one request, far below any server's limit
SCROLL_PAGE = 2048


class ChunkLookup(Protocol):
    """What retrieval and answering read of a chunk set. Rankings inside retrieval are keyed by the lookup's key:
    `ranking` turns scored points (asked for no payload) into (key, score), `key` a chunk id into its key, `point` a
    key into its point id; `read` gives records by key, `chunk_ids` chunk ids by key."""

    def __len__(self) -> int: ...

    def ranking(self, points) -> list[tuple[str, float]]: ...

    def key(self, chunk_id: str) -> str: ...

    def point(self, key: str) -> str: ...

    def keep_known(self, ranking: list[tuple[str, float]]) -> list[tuple[str, float]]: ...

    def read(self, keys: Sequence[str]) -> dict[str, dict]: ...

    def chunk_ids(self, keys: Sequence[str]) -> dict[str, str]: ...

    def get_many(self, chunk_ids: Sequence[str]) -> dict[str, dict]: ...

    def allowed_ids(self, flt: SearchFilter) -> set[str]: ...

    def texts(self, limit: int) -> list[str] | None: ...

    def catalog(self, per_document: int = 8, doc_ids: Collection[str] | None = None) -> Catalog: ...

    def document_count(self) -> int: ...


class TableChunks:
    """A chunk table indexed by chunk_id, in memory: what every search used before PayloadChunks. Its key is the
    chunk id."""

    def __init__(self, table: pd.DataFrame):
        self.table = table
        self._point_chunks: dict[str, str] | None = None
        self._document_rows: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, chunk_id: object) -> bool:
        return isinstance(chunk_id, str) and chunk_id in self.table.index

    def point_chunks(self) -> dict[str, str]:
        if self._point_chunks is None:
            self._point_chunks = {point_id(cid): cid for cid in self.table.index}
        return self._point_chunks

    def ranking(self, points) -> list[tuple[str, float]]:
        """Points of chunks this table does not hold (between a re-chunk and its re-embed) are left out, as
        retrieve() would drop them."""
        chunks = self.point_chunks()
        return [(chunks[pid], float(p.score)) for p in points if (pid := str(p.id)) in chunks]

    def key(self, chunk_id: str) -> str:
        return chunk_id

    def point(self, key: str) -> str:
        return point_id(key)

    def keep_known(self, ranking: list[tuple[str, float]]) -> list[tuple[str, float]]:
        index = self.table.index
        return [(cid, score) for cid, score in ranking if cid in index]

    def read(self, keys: Sequence[str]) -> dict[str, dict]:
        return self.get_many(keys)

    def chunk_ids(self, keys: Sequence[str]) -> dict[str, str]:
        return {key: key for key in keys}

    def get_many(self, chunk_ids: Sequence[str]) -> dict[str, dict]:
        # One lookup for many: a pandas lookup per hit was a large share of a fast query's own time.
        wanted = [cid for cid in dict.fromkeys(chunk_ids) if cid in self]
        rows = self.table.loc[wanted].to_dict("records") if wanted else []
        return {cid: {"chunk_id": cid, **row} for cid, row in zip(wanted, rows)}

    def allowed_ids(self, flt: SearchFilter) -> set[str]:
        df = self.table
        keep = pd.Series(True, index=df.index)
        if flt.doc_ids:
            keep &= df["doc_id"].isin(flt.doc_ids)
        if flt.page_from is not None:
            keep &= df["page_end"] >= flt.page_from
        if flt.page_to is not None:
            keep &= df["page_start"] <= flt.page_to
        return set(df.index[keep])

    def texts(self, limit: int) -> list[str] | None:
        if "text" not in getattr(self.table, "columns", ()) or len(self.table) > limit:
            return None
        return self.table["text"].astype(str).tolist()

    def catalog(self, per_document: int = 8, doc_ids: Collection[str] | None = None) -> Catalog:
        from rag.qa.overview import Catalog

        table = self.table
        if doc_ids is not None:
            # Each document's rows found once: filtering the whole table per question cost O(corpus) a question.
            if self._document_rows is None:
                self._document_rows = {str(d): rows for d, rows in table.groupby("doc_id", sort=False).indices.items()}
            found = [self._document_rows[d] for d in sorted(set(map(str, doc_ids))) if d in self._document_rows]
            table = table.iloc[np.concatenate(found)] if found else table.iloc[:0]
        return Catalog.from_chunks(table, per_document)

    def document_count(self) -> int:
        return int(self.table["doc_id"].nunique()) if len(self.table) else 0


def lookup_of(index) -> ChunkLookup | None:
    """The chunk records of an index (rag.retrieval.Index.lookup), or of any object holding a chunk table as
    `chunks`; None without either."""
    lookup = getattr(index, "lookup", None)
    if lookup is not None:
        return lookup
    chunks = getattr(index, "chunks", None)
    return TableChunks(chunks) if isinstance(chunks, pd.DataFrame) else None


def _record(payload: dict) -> dict:
    return {field: payload.get(field) for field in RECORD_FIELDS}


class PayloadChunks:
    """A collection's payloads, read per hit: memory bounded by what a question returns, not by the chunk set. Its
    key is the point id: a search reads no payload, only the records of what it returns."""

    def __init__(self, client, alias: str):
        self.client, self.alias = client, alias

    def __len__(self) -> int:
        return int(self.client.count(self.alias, exact=False).count)

    def ranking(self, points) -> list[tuple[str, float]]:
        return [(str(p.id), float(p.score)) for p in points]

    def key(self, chunk_id: str) -> str:
        return point_id(chunk_id)

    def point(self, key: str) -> str:
        return key

    def keep_known(self, ranking: list[tuple[str, float]]) -> list[tuple[str, float]]:
        # A ranked point came from this collection (or from a bm25s index of the chunk set, for old collections):
        # read() skips any the collection lacks, and retrieve() reads further down the ranking to fill k.
        return ranking

    def read(self, keys: Sequence[str]) -> dict[str, dict]:
        return {key: _record(payload) for key, payload in self._points(list(keys), list(RECORD_FIELDS)).items()}

    def chunk_ids(self, keys: Sequence[str]) -> dict[str, str]:
        return {key: payload["chunk_id"] for key, payload in self._points(list(keys), ["chunk_id"]).items()}

    def get_many(self, chunk_ids: Sequence[str]) -> dict[str, dict]:
        wanted = list(dict.fromkeys(c for c in chunk_ids if isinstance(c, str)))
        found = self._fields(wanted, list(RECORD_FIELDS))
        return {cid: _record(found[cid]) for cid in wanted if cid in found}

    def _scroll(self, fields: list[str], scroll_filter=None) -> Iterator[dict]:
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.alias,
                scroll_filter=scroll_filter,
                limit=SCROLL_PAGE,
                offset=offset,
                with_payload=fields,
                with_vectors=False,
            )
            for point in points:
                yield point.payload or {}
            if offset is None:
                return

    def allowed_ids(self, flt: SearchFilter) -> set[str]:
        """The chunks a filter keeps (a bm25s search of an old collection filters by them), read from the engine:
        as many as the filter keeps, not the whole chunk set."""
        from rag.retrieval import qdrant_filter

        return {p["chunk_id"] for p in self._scroll(["chunk_id"], qdrant_filter(flt)) if p.get("chunk_id")}

    def texts(self, limit: int) -> list[str] | None:
        if len(self) > limit:
            return None
        return [str(p.get("text") or "") for p in self._scroll(["text"])]

    def catalog(self, per_document: int = 8, doc_ids: Collection[str] | None = None) -> Catalog:
        """The documents for overview questions (rag.qa.overview), read from the engine: each document's first chunk
        (the one without a previous chunk) and, for its title, the section paths along its next-chunk links, as far
        as `per_document` chunks or the first heading. One small entry per document stays in memory; a document's
        opening chunks are read when an answer shows it. `doc_ids`: those documents only, found through the doc_id
        index, so what is read is theirs (the whole catalog reads every chunk's payload once to find the first ones)."""
        from qdrant_client import models

        from rag.qa.overview import Catalog, heading
        from rag.retrieval import SearchFilter, qdrant_filter

        fields = ["chunk_id", "doc_id", "section_path", "next_chunk_id"]
        must: list = [models.IsNullCondition(is_null=models.PayloadField(key="prev_chunk_id"))]
        if doc_ids is not None:
            if not doc_ids:
                return Catalog([])
            must += qdrant_filter(SearchFilter(doc_ids=sorted(map(str, doc_ids)))).must
        first = models.Filter(must=must)
        heads = {str(p["doc_id"]): p for p in self._scroll(fields, first) if p.get("doc_id") and p.get("chunk_id")}
        titles: dict[str, str] = {}
        current = dict(heads)  # document -> the chunk of it looked at last
        for step in range(per_document):
            for doc, payload in list(current.items()):
                if (title := heading(payload)) is not None:
                    titles[doc] = title
                    del current[doc]
            if step == per_document - 1:
                break
            following = {p["next_chunk_id"]: doc for doc, p in current.items() if p.get("next_chunk_id")}
            current = {following[cid]: p for cid, p in self._fields(list(following), fields).items()}
            if not current:
                break
        return Catalog.from_openings(
            {doc: (titles.get(doc), head["chunk_id"]) for doc, head in heads.items()},
            lambda first_chunk: self.chain(first_chunk, per_document),
        )

    def _fields(self, chunk_ids: list[str], fields: list[str]) -> dict[str, dict]:
        """Payload fields by chunk id (chunk_id among `fields`)."""
        points = self._points([point_id(cid) for cid in chunk_ids], fields)
        return {payload["chunk_id"]: payload for payload in points.values()}

    def _points(self, ids: list[str], fields: list[str]) -> dict[str, dict]:
        """Payload fields by point id, of the points that carry a chunk_id (chunk_id among `fields`)."""
        found = {}
        for start in range(0, len(ids), READ_BATCH):
            for point in self.client.retrieve(
                self.alias, ids=ids[start : start + READ_BATCH], with_payload=fields, with_vectors=False
            ):
                if point.payload and point.payload.get("chunk_id"):
                    found[str(point.id)] = point.payload
        return found

    def chain(self, first_chunk_id: str, n: int) -> list[dict]:
        """Up to `n` records from a chunk along its next-chunk links (a document's opening, in text order)."""
        out: list[dict] = []
        cid: str | None = first_chunk_id
        while cid and len(out) < n:
            record = self.get_many([cid]).get(cid)
            if record is None:
                break
            out.append(record)
            cid = record.get("next_chunk_id")
        return out

    def document_count(self) -> int:
        return len({p.get("doc_id") for p in self._scroll(["doc_id"])})
