"""Training must do something: an embedder fine-tuned on a small synthetic set beats its untrained self on the
set's held-out questions, through the same train -> gate path as the retrain job. (The reranker's counterpart is
in tests/test_reranker_ltr.py.)

The task is one the base model cannot solve and training can: questions name two things by made-up words
("blicket" for "lighthouse", ...), each passage talks about two real things. The training questions teach the
made-up words; the held-out questions combine them in pairs never seen in training."""

import hashlib
import itertools
import random

import pandas as pd

from rag.evaluation.qaset import Evidence, QAItem, to_frame
from rag.registry import ModelRegistry
from rag.store import CHUNKS_TABLE, TableStore

STRATEGY = "codes"
THINGS = [
    "lighthouse",
    "violin",
    "volcano",
    "strawberry",
    "submarine",
    "cactus",
    "telescope",
    "penguin",
    "bicycle",
    "glacier",
    "piano",
    "tornado",
]
CODES = ["blicket", "wug", "dax", "toma", "fep", "zav", "kiki", "moop", "spog", "tulver", "glorp", "nandle"]


def code_task(seed: int = 0):
    pairs = list(itertools.combinations(range(len(THINGS)), 2))
    random.Random(seed).shuffle(pairs)
    texts, items = {}, []
    for n, (a, b) in enumerate(pairs):
        cid = f"p{n}"
        texts[cid] = f"This short note is about the {THINGS[a]} and the {THINGS[b]}."
        items.append(
            QAItem(
                qid=f"q{n}",
                question=f"{CODES[a]} with {CODES[b]}",
                qtype="dataset",
                doc_id=cid,
                evidence=[Evidence(doc_id=cid, start=0, end=len(texts[cid]))],
                split="train" if n % 3 else "dev",
            )
        )
    rows = [
        {
            "chunk_id": cid,
            "doc_id": cid,
            "strategy": STRATEGY,
            "text": t,
            "char_start": 0,
            "char_end": len(t),
            "page_start": 1,
            "page_end": 1,
            "section_path": [],
            "prev_chunk_id": None,
            "next_chunk_id": None,
            "n_tokens": len(t.split()),
            "content_hash": hashlib.sha256(t.encode()).hexdigest(),
            "table_html": None,
        }
        for cid, t in texts.items()
    ]
    return pd.DataFrame(rows), items


def test_finetuned_embedder_beats_its_untrained_self_on_held_out_questions(tmp_path, monkeypatch):
    from rag.training import EmbedderTrainingConfig, GateSettings
    from rag.training.pipeline import gate_candidate, train_candidate

    chunks, items = code_task()
    tables = TableStore(tmp_path / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    tables.write(to_frame(items), "synthetic_qa")
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    registry = ModelRegistry(tmp_path / "models")
    config = EmbedderTrainingConfig(
        epochs=6,
        batch_size=16,
        loss="mnrl",
        learning_rate=2e-4,
        max_seq_length=32,
        hard_negatives=False,
        warmup_ratio=0.0,
        # once per epoch: the default (4 a epoch, at least one a step) would save 18 checkpoints of 90 MB here
        evaluations_per_epoch=1,
    )
    mv, run, inputs = train_candidate("embedder", tables, registry, config, log=lambda _: None)
    assert inputs.data.gate and len(inputs.data.gate) >= 5
    assert not set(inputs.data.gate.queries.values()) & {q for q, _ in inputs.data.positives}  # held out for real

    # Production is the untrained base model (implicit v0): the candidate must beat it significantly. Its gate
    # questions are all generated, so by default the gain is recorded without promoting (a canary decides) ...
    held = gate_candidate("embedder", tables, registry, mv, GateSettings(resamples=2000))
    assert held.better_on_generated and held.outcome == "inconclusive" and not held.passed
    assert registry.resolve("embedder", mv.version).metrics["gate"]["better_on_generated"] is True
    # ... and promotes once such gains may.
    result = gate_candidate(
        "embedder", tables, registry, mv, GateSettings(resamples=2000, generated_embedder_gain="promote")
    )
    assert result.metadata["delta_mrr@10"] > 0.1, result.metadata
    assert result.passed, result.reasons


def test_gate_decides_on_questions_that_are_not_copies_of_the_documents(tmp_path, monkeypatch):
    """Inverse-cloze questions are sentences of the documents: people do not ask like that (on SciFact's claims a
    model that improved on them lost on real questions; on human questions over papers a reranker gated on them
    read -8 nDCG@10 while it helped people). They are set aside, for embedders and rerankers alike, and the verdict
    comes from the other questions; with only copies there is no verdict but an error that says what to generate."""
    import pytest

    from rag.embedding import _minilm_dir
    from rag.training import GateSettings
    from rag.training.pipeline import gate_candidate

    topics = THINGS + CODES
    texts = {
        f"p{i}": f"Notes on the {t}. The {t} was studied by team {i} over many years." for i, t in enumerate(topics)
    }
    chunks, _ = code_task()
    chunks = pd.concat(
        [
            chunks.iloc[:0],
            pd.DataFrame(
                [
                    {**chunks.iloc[0].to_dict(), "chunk_id": c, "doc_id": c, "text": t, "char_end": len(t)}
                    for c, t in texts.items()
                ]
            ),
        ]
    )

    def item(i: int, t: str, question: str, qtype: str) -> QAItem:
        return QAItem(
            qid=f"{qtype}{i}",
            question=question,
            qtype=qtype,
            doc_id=f"p{i}",
            split="train" if i % 3 == 0 else "dev",
            evidence=[Evidence(doc_id=f"p{i}", start=0, end=len(texts[f"p{i}"]))],
        )

    copies = [
        item(i, t, f"The {t} was studied by team {i} over many years.", "inverse-cloze") for i, t in enumerate(topics)
    ]
    tables = TableStore(tmp_path / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    tables.write(to_frame(copies), "synthetic_qa")
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    registry = ModelRegistry(tmp_path / "models")
    candidate = registry.register("embedder", _minilm_dir(), {"base_model": "minilm", "strategy": STRATEGY})
    with pytest.raises(ValueError, match="copied word for word from the documents and cannot decide"):
        gate_candidate("embedder", tables, registry, candidate, GateSettings(resamples=500))
    # No verdict either way, recorded as such: production stays, and a retrain says why rather than failing.
    recorded = registry.resolve("embedder", candidate.version).metrics["gate"]
    assert (
        recorded["outcome"] == "no verdict" and recorded["passed"] is False and recorded["production_version"] is None
    )

    asked = [item(i, t, f"who studied the {t}?", "answer-aware") for i, t in enumerate(topics)]
    tables.write(to_frame(copies + asked), "synthetic_qa")
    candidate = registry.register("embedder", _minilm_dir(), {"base_model": "minilm", "strategy": STRATEGY})
    result = gate_candidate("embedder", tables, registry, candidate, GateSettings(resamples=500))
    assert result.copied_questions > 0 and result.questions >= 5  # the copies were set aside, the rest decided
    assert set(result.by_type) == {"answer-aware"} and result.outcome == "unchanged"  # the same weights: no change
    gate = registry.resolve("embedder", candidate.version).metrics["gate"]
    assert gate["copied_questions_set_aside"] == result.copied_questions and gate["passed"] is False
    assert gate["ci_low_ndcg@10"] == gate["ci_high_ndcg@10"] == 0.0
