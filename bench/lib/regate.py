"""Gate a finished loop run's trained rankers again, on a copy of its work folder: against a chosen production (none:
the untrained default), on the candidate's own share of users' held-out questions and cross-fitted over every share
(rag.training.folds). The copy keeps the run's own registry and feedback untouched."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

GATE_FIGURES = (
    "outcome",
    "questions",
    "changed_questions",
    "delta_ndcg@10",
    "p_value_ndcg@10",
    "delta_mrr@10",
    "p_value_mrr@10",
    "lists",
    "gate_questions_by_fold",
)


def regate(work_dir: Path, against: str | None) -> list[dict]:
    """Every reranker version of the run gated against `against` (a version such as "v1"; None: no reranker), once
    on its own share and once cross-fitted where it and production hold fold rankers."""
    import rag.training.pipeline as pipeline
    from rag.registry import ModelRegistry
    from rag.store import TableStore
    from rag.training import GateSettings

    rows = []
    with tempfile.TemporaryDirectory(prefix="regate-") as scratch:
        copy = Path(scratch) / "data"
        shutil.copytree(Path(work_dir) / "data", copy)
        before = os.environ.get("RAG_DATA_DIR")
        os.environ["RAG_DATA_DIR"] = str(copy)
        try:
            registry, tables = ModelRegistry(copy / "models"), TableStore(copy / "tables")
            resolve = registry.resolve

            def production_is_against(kind: str, alias: str):
                if kind == "reranker" and alias == "production":
                    return resolve(kind, against) if against else None
                return resolve(kind, alias)

            registry.resolve = production_is_against
            folds = pipeline.trained_folds
            for mv in registry.versions("reranker"):
                if against and mv.version == resolve("reranker", against).version:
                    continue
                for pooled in (False, True):
                    if pooled and not folds(mv.path):
                        continue
                    pipeline.trained_folds = folds if pooled else (lambda path: [])
                    try:
                        result = pipeline.gate_candidate("reranker", tables, registry, mv, GateSettings())
                    finally:
                        pipeline.trained_folds = folds
                    figures = result.metadata
                    if pooled and not figures.get("gate_questions_by_fold"):
                        continue  # nothing pooled (production holds no fold rankers): the own share's row says it
                    rows.append(
                        {
                            "candidate": mv.name,
                            "against": against or "no reranker (untrained default)",
                            "questions_from": "every share (cross-fitted)" if pooled else "its own share",
                            **{k: figures.get(k) for k in GATE_FIGURES if figures.get(k) is not None},
                        }
                    )
        finally:
            if before is None:
                os.environ.pop("RAG_DATA_DIR", None)
            else:
                os.environ["RAG_DATA_DIR"] = before
    return rows
