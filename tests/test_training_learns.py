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
THINGS = ["lighthouse", "violin", "volcano", "strawberry", "submarine", "cactus", "telescope", "penguin", "bicycle",
          "glacier", "piano", "tornado"]
CODES = ["blicket", "wug", "dax", "toma", "fep", "zav", "kiki", "moop", "spog", "tulver", "glorp", "nandle"]


def code_task(seed: int = 0):
    pairs = list(itertools.combinations(range(len(THINGS)), 2))
    random.Random(seed).shuffle(pairs)
    texts, items = {}, []
    for n, (a, b) in enumerate(pairs):
        cid = f"p{n}"
        texts[cid] = f"This short note is about the {THINGS[a]} and the {THINGS[b]}."
        items.append(QAItem(qid=f"q{n}", question=f"{CODES[a]} with {CODES[b]}", qtype="dataset", doc_id=cid,
                            evidence=[Evidence(doc_id=cid, start=0, end=len(texts[cid]))],
                            split="train" if n % 3 else "dev"))
    rows = [{"chunk_id": cid, "doc_id": cid, "strategy": STRATEGY, "text": t, "char_start": 0, "char_end": len(t),
             "page_start": 1, "page_end": 1, "section_path": [], "prev_chunk_id": None, "next_chunk_id": None,
             "n_tokens": len(t.split()), "content_hash": hashlib.sha256(t.encode()).hexdigest(), "table_html": None}
            for cid, t in texts.items()]
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
    config = EmbedderTrainingConfig(epochs=6, batch_size=16, loss="mnrl", learning_rate=2e-4, max_seq_length=32,
                                    hard_negatives=False, warmup_ratio=0.0)
    mv, run, inputs = train_candidate("embedder", tables, registry, config, log=lambda _: None)
    assert inputs.data.gate and len(inputs.data.gate) >= 5
    assert not set(inputs.data.gate.queries.values()) & {q for q, _ in inputs.data.positives}  # held out for real

    # Production is the untrained base model (implicit v0): the candidate must beat it significantly.
    result = gate_candidate("embedder", tables, registry, mv, GateSettings(resamples=2000))
    assert result.metadata["delta_mrr@10"] > 0.1, result.metadata
    assert result.passed, result.reasons
