"""The corpus and QA set a search runs on.

QA_DIR (the CLI's `--qa`) is a folder holding either
- the synthetic_qa Parquet (`data.parquet`, as the synthetic_qa asset writes it under <data dir>/tables/synthetic_qa):
  its documents are the pipeline's parsed documents, so the search runs in the data dir and reuses its indexes; or
- a SQuAD v1.1 JSON (`*.json` / `*.json.gz`, read with rag.evaluation.qaset.import_squad): each paragraph becomes a
  document in a scratch workspace under <data dir>/search/corpora/<hash>, which keeps its own tables and Qdrant.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from rag.evaluation.qaset import QAItem, from_frame, import_squad
from rag.index.qdrant import QdrantSettings
from rag.ingest import document_to_row
from rag.parsing.models import ElementDraft, ParsedDocument, assemble
from rag.tuning.evaluate import Workspace
from rag.store import DOCUMENTS_TABLE, TableStore


def corpus_workspace(docs: list[ParsedDocument], folder: Path) -> Workspace:
    """A scratch workspace holding exactly these documents (rewritten only when they change)."""
    tables = TableStore(Path(folder) / "tables")
    rows = pd.DataFrame([document_to_row(d, "config-search") for d in docs])
    old = tables.read(DOCUMENTS_TABLE, columns=["doc_id", "content_hash"])
    if old is None or sorted(zip(old.doc_id, old.content_hash)) != sorted(zip(rows.doc_id, rows.content_hash)):
        tables.write(rows, DOCUMENTS_TABLE)
    return Workspace(Path(folder))


def documents_from_texts(texts: dict[str, str], source: str) -> list[ParsedDocument]:
    """One single-element document per text, so evidence offsets into the text stay valid."""
    return [
        assemble(
            [ElementDraft(type="narrative", text=text)],
            doc_id=doc_id,
            source_path=source,
            content_hash=hashlib.sha256(text.encode()).hexdigest(),
            parser="squad",
            n_pages=1,
        )
        for doc_id, text in texts.items()
    ]


def load_qa_dir(qa_dir: Path, data_root: Path) -> tuple[Workspace, list[QAItem]]:
    qa_dir = Path(qa_dir)
    if not qa_dir.is_dir():
        raise FileNotFoundError(
            f"--qa {qa_dir} is not a folder: pass the synthetic_qa folder "
            "(<data dir>/tables/synthetic_qa) or a folder holding a SQuAD JSON"
        )
    parquet = sorted(qa_dir.glob("*.parquet"))
    squad = sorted(p for p in qa_dir.iterdir() if p.name.endswith((".json", ".json.gz")))
    if parquet:
        items = [i for p in parquet for i in from_frame(pd.read_parquet(p))]
        workspace = Workspace(
            Path(data_root), QdrantSettings.from_env()
        )  # the pipeline's own Qdrant: indexes are shared
        docs = workspace.tables.read(DOCUMENTS_TABLE, columns=["doc_id"])
        known = set(docs.doc_id) if docs is not None else set()
        missing = {e.doc_id for i in items for e in i.evidence} - known
        if missing:
            raise ValueError(
                f"{len(missing)} document(s) of the QA set are not parsed under {data_root} "
                f"(e.g. {sorted(missing)[0]!r}): ingest the documents it was generated from (rag index DOCS)"
            )
        return workspace, items
    if squad:
        texts, items = {}, []
        for path in squad:
            t, i = import_squad(path)
            texts.update(t)
            items += i
        digest = hashlib.sha256("".join(f"{p.name}:{p.stat().st_size}" for p in squad).encode()).hexdigest()[:12]
        return corpus_workspace(
            documents_from_texts(texts, str(qa_dir)), Path(data_root) / "search" / "corpora" / digest
        ), items
    raise FileNotFoundError(
        f"no QA set in {qa_dir}: expected the synthetic_qa data.parquet or a SQuAD *.json / *.json.gz"
    )
