"""The gate's pool: a held-out question people asked is judged only where they looked, so a candidate that brings up
a relevant passage production never showed cannot be credited. The gate lists the pairs that would tell the two
models apart and that nobody rated; the annotation queue puts them first; the experts' grades join the question's
judgments; and the next verdict sees the gain."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd

from rag.annotation.build import pooled_items, with_pool
from rag.annotation.pool import GatePool, PoolItem, pool_of, read_pools, write_pool
from rag.annotation.queue import AnnotationQueue, QueueItem, item_id
from rag.training.config import GateSettings
from rag.training.data import IRSet, split_feedback
from rag.training.gate import UnjudgedPair, compare_runs, unjudged_pairs
from rag.training.pipeline import pool_unjudged

N = 30
NOISE = [f"n{j}" for j in range(8)]
CORPUS = {f"a{i}": f"answer {i} as people found it" for i in range(N)}
CORPUS |= {f"b{i}": f"answer {i} production never showed" for i in range(N)}
CORPUS |= {n: f"noise passage {n}" for n in NOISE}


def _run(order: list[str]) -> dict[str, float]:
    return {p: float(len(order) - r) for r, p in enumerate(order)}


def production_run(i: int) -> dict[str, float]:
    return _run(["n0", f"a{i}", *NOISE[1:]])  # people skipped n0 (-1) and opened a_i (+1)


def candidate_run(i: int) -> dict[str, float]:
    return _run([f"b{i}", "n0", f"a{i}", *NOISE[1:]])  # b_i first: relevant, but nobody was shown it


def people(expert_grades: list[tuple[str, str, int]] = ()) -> SimpleNamespace:
    """A feedback dataset: person i asked question i, opened a_i (+1) and skipped n0 (-1); expert rows name the same
    question text under their own dataset id (a queue item of the gate's pool has no production query id)."""
    queries = {f"u{i}": f"what is the answer to question {i}?" for i in range(N)}
    chunk_qrels = [(f"u{i}", f"a{i}", 1) for i in range(N)] + [(f"u{i}", "n0", -1) for i in range(N)]
    rows = []
    for i, passage, grade in expert_grades:
        queries[f"expert:{i}"] = queries[f"u{i}"].upper()  # however it is cased, the same question
        rows.append((f"expert:{i}", passage, grade))
    return SimpleNamespace(queries=queries, corpus=CORPUS, chunk_qrels=chunk_qrels, expert_qrels=rows)


def gate_set(judged) -> IRSet:
    """The held-out questions as training_data makes them gate questions (every question held out)."""
    split = split_feedback(judged, 1.0)
    assert not split.expert_dev_queries  # people's questions stay theirs, whatever experts graded
    return IRSet(
        dict(split.dev_queries),
        CORPUS,
        {q: dict(rel) for q, rel in split.dev_qrels.items()},
        {q: set(rated) for q, rated in split.dev_judged.items()},
        dict.fromkeys(split.dev_queries, "feedback"),
    )


def runs(ir: IRSet) -> tuple[dict, dict]:
    index = {text: int(text.split()[-1].rstrip("?")) for text in ir.queries.values()}
    ids = {q: index[t] for q, t in ir.queries.items()}
    return {q: production_run(i) for q, i in ids.items()}, {q: candidate_run(i) for q, i in ids.items()}


SETTINGS = GateSettings(resamples=2000)


def test_the_pool_is_what_either_model_ranks_high_and_the_other_does_not_that_nobody_rated():
    ir = IRSet({"q": "question"}, CORPUS, {"q": {"a0": 1}}, {"q": {"a0", "n0"}}, {"q": "feedback"})
    production, candidate = {"q": production_run(0)}, {"q": candidate_run(0)}
    assert unjudged_pairs(ir, production, candidate, depth=5) == [
        UnjudgedPair("q", "b0", "candidate", 1),  # the candidate's new passage
        UnjudgedPair("q", "n3", "production", 5),  # and what production ranks there instead: both sides, no favourite
    ]
    fully_judged = IRSet({"g": "generated"}, CORPUS, {"g": {"a0": 1}}, {}, {"g": "answer-aware"})
    assert unjudged_pairs(fully_judged, {"g": production_run(0)}, {"g": candidate_run(0)}, depth=5) == []


def test_experts_grading_the_pool_turn_a_hidden_gain_into_a_verdict_of_better():
    ir = gate_set(people())
    before = compare_runs(ir, *runs(ir), SETTINGS)
    assert not before.better and before.outcome == "worse"  # b_i counts as irrelevant: a_i only moved down
    assert {(p.side, p.rank) for p in before.unjudged} == {("candidate", 1), ("production", 5)}
    assert len(before.unjudged) == 2 * N and before.metadata["unjudged_pairs"] == 2 * N  # the verdict says so
    texts = {q: int(t.split()[-1].rstrip("?")) for q, t in ir.queries.items()}
    # The experts grade the pool: each b_i answers (2), the noise production ranked fifth does not (0).
    grades = [(texts[p.qid], p.passage, 2 if p.passage.startswith("b") else 0) for p in before.unjudged]
    after_ir = gate_set(people(grades))
    assert all({"a", "b"} <= {c[0] for c in rel} for rel in after_ir.qrels.values())  # people's key kept, b_i joined
    after = compare_runs(after_ir, *runs(after_ir), SETTINGS)
    assert after.better and after.outcome == "better"
    assert compare_runs(after_ir, *runs(after_ir), SETTINGS.model_copy(update={"pool_depth": 0})).unjudged == []
    assert not [p for p in after.unjudged if p.passage.startswith("b")]  # judged now: no longer pooled


def test_an_experts_zero_on_the_pool_keeps_the_verdict_where_it_was():
    ir = gate_set(people())
    before = compare_runs(ir, *runs(ir), SETTINGS)
    texts = {q: int(t.split()[-1].rstrip("?")) for q, t in ir.queries.items()}
    after_ir = gate_set(people([(texts[p.qid], p.passage, 0) for p in before.unjudged]))
    after = compare_runs(after_ir, *runs(after_ir), SETTINGS)
    assert not after.better and after.outcome == "worse"


def _chunks() -> pd.DataFrame:
    return pd.DataFrame(
        [{"chunk_id": c, "doc_id": f"doc-{c}", "text": t, "page_start": 1, "page_end": None} for c, t in CORPUS.items()]
    )


def test_the_pipeline_writes_the_pool_after_a_verdict_short_of_better_and_clears_it_after_better(tmp_path):
    ir = gate_set(people())
    result = compare_runs(ir, *runs(ir), SETTINGS)
    candidate = SimpleNamespace(name="ce-ltr-v2")
    recorded = {"against": "ce-ltr-v1", "strategy": "paragraph"}
    pool_unjudged(tmp_path, "reranker", candidate, result, ir, _chunks(), recorded)
    (pool,) = read_pools(tmp_path)
    assert pool.kind == "reranker" and pool.candidate == "ce-ltr-v2" and pool.outcome == "worse"
    assert len(pool.items) == 2 * N and {i.doc_id for i in pool.items} >= {"doc-b0", "doc-n3"}
    assert {i.question for i in pool.items} == set(ir.queries.values())
    result.better = True
    pool_unjudged(tmp_path, "reranker", candidate, result, ir, _chunks(), recorded)
    assert read_pools(tmp_path) == []


def _pool(kind: str, pairs: list[tuple[str, str]], created: str) -> GatePool:
    items = [
        PoolItem(question=q, chunk_id=c, doc_id="d", text=f"text of {c}", side="candidate", rank=1) for q, c in pairs
    ]
    return GatePool(created_at=created, kind=kind, candidate="v2", against="v1", outcome="inconclusive", items=items)


def _item(question: str, chunk: str) -> QueueItem:
    return QueueItem(
        item_id=item_id(question, chunk),
        question=question,
        source="production",
        chunk_id=chunk,
        doc_id="d",
        text=chunk,
        uncertainty=0.5,
    )


def test_the_queue_puts_the_pool_first_newest_pool_first_without_labelled_pairs_or_repeats(tmp_path):
    old = _pool("embedder", [("q1", "c1"), ("q2", "c2")], "2026-01-01T00:00:00Z")
    new = _pool("reranker", [("q3", "c3"), ("q1", "c1"), ("Q3 ", "c4")], "2026-02-01T00:00:00Z")
    write_pool(tmp_path, old), write_pool(tmp_path, new)
    (tmp_path / "annotation" / "gate_pool" / "broken.json").write_text("{not json")
    pools = read_pools(tmp_path)
    assert [p.kind for p in pools] == ["reranker", "embedder"]
    items = pooled_items(pools, 10, labelled={item_id("q2", "c2")})
    assert [(i.question, i.chunk_id) for i in items] == [("q3", "c3"), ("Q3 ", "c4"), ("q1", "c1")]
    assert {i.source for i in items} == {"gate"} and items[0].signals["reranker_candidate_rank"] == 1.0
    assert len(pooled_items(pools, 2)) == 2
    assert pooled_items(pools, 10, furniture=lambda chunk: chunk["chunk_id"] == "c3")[0].chunk_id == "c4"
    queue = AnnotationQueue(strategy="paragraph", selection="active", items=[_item("q9", "c9"), _item("q1", "c1")])
    merged = with_pool(queue, items)
    assert [(i.question, i.chunk_id) for i in merged.items] == [("q3", "c3"), ("Q3 ", "c4"), ("q1", "c1"), ("q9", "c9")]
    assert json.loads(merged.model_dump_json())["items"][0]["source"] == "gate"


def test_pool_of_leaves_out_pairs_the_chunk_set_does_not_hold():
    pairs = [UnjudgedPair("q", "a0", "candidate", 1), UnjudgedPair("q", "gone", "production", 2)]
    pool = pool_of(pairs, {"q": "question"}, _chunks(), kind="embedder", candidate="v2", against="v1", outcome="x")
    assert [i.chunk_id for i in pool.items] == ["a0"] and pool.items[0].page_end is None


# --- questions production failed: no passage people liked, so no answer key until experts grade the pool ----------
FAILED = {f"f{j}": f"which passage answers failed question {j}?" for j in range(N)}
CORPUS |= {f"c{j}": f"the answer to failed question {j}, never shown" for j in range(N)}


def failed_run(j: int, candidate: bool) -> dict[str, float]:
    return _run(([f"c{j}"] if candidate else []) + NOISE)  # production showed noise only, n0 rated -1


def with_failures(expert_grades=()) -> SimpleNamespace:
    judged = people()
    judged.queries |= FAILED
    judged.chunk_qrels += [(q, "n0", -1) for q in FAILED]
    judged.answer_votes = dict.fromkeys(FAILED, -1)
    for j, passage, grade in expert_grades:
        judged.queries[f"expert:f{j}"] = FAILED[f"f{j}"]
        judged.expert_qrels.append((f"expert:f{j}", passage, grade))
    return judged


def _failed_index(text: str) -> int:
    return int(text.split()[-1].rstrip("?"))


def test_questions_production_failed_are_pooled_first_and_once_graded_decide_beside_people_s_own(tmp_path):
    from rag.evaluation.qaset import Evidence, QAItem
    from rag.training.data import training_data

    # Generated questions on the users' answers (train split only, so the gate is people's questions).
    items = [
        QAItem(
            qid=f"s{i}",
            question=f"generated {i}",
            qtype="answer-aware",
            doc_id=f"doc-a{i}",
            evidence=[Evidence(doc_id=f"doc-a{i}", start=0, end=5)],
            split="train",
        )
        for i in range(5)
    ]
    chunks = _chunks().assign(
        char_start=0, char_end=lambda f: f["text"].str.len(), content_hash=lambda f: f["chunk_id"]
    )

    def gate_of(judged) -> IRSet:
        split = split_feedback(judged, 1.0)
        data = training_data(items, chunks, feedback=split, selection_fraction=0.0, min_expert_gate=10)
        assert data.summary["gate_unanswered_questions"] == len(data.gate.unanswered)  # the run says how many
        return data.gate

    def runs_of(ir: IRSet) -> tuple[dict, dict]:
        pooled = ir.with_unanswered()
        production, candidate = {}, {}
        for q, text in pooled.queries.items():
            if text in FAILED.values():
                production[q], candidate[q] = (
                    failed_run(_failed_index(text), False),
                    failed_run(_failed_index(text), True),
                )
            else:
                i = _failed_index(text)
                production[q], candidate[q] = production_run(i), candidate_run(i)
        return production, candidate

    gate = gate_of(with_failures())
    assert len(gate.unanswered) == N and set(gate.types.values()) == {"feedback"}
    assert all(judged == {"n0"} for judged in gate.unanswered_judged.values())
    before = compare_runs(gate, *runs_of(gate), SETTINGS, pooled=gate.with_unanswered())
    assert before.questions == N and not before.better  # the failures decide nothing yet
    first = before.unjudged[: 2 * N]
    assert {p.qid for p in first} == set(gate.unanswered)  # where production failed comes first
    assert {p.passage for p in first if p.side == "candidate"} == {f"c{j}" for j in range(N)}

    # The experts grade the whole pool: each c_j answers its failed question, b_i answers question i.
    texts = {**gate.unanswered, **gate.queries}
    grades = [(texts[p.qid], p.passage, 2 if p.passage[0] in "bc" else 0) for p in before.unjudged]
    failed_grades = [(_failed_index(t), c, g) for t, c, g in grades if t in FAILED.values()]
    people_grades = [(_failed_index(t), c, g) for t, c, g in grades if t not in FAILED.values()]
    judged = with_failures(failed_grades)
    for i, passage, grade in people_grades:
        judged.queries[f"expert:{i}"] = judged.queries[f"u{i}"]
        judged.expert_qrels.append((f"expert:{i}", passage, grade))
    after_gate = gate_of(judged)
    kinds = set(after_gate.types.values())
    assert kinds == {"feedback", "expert"} and not after_gate.unanswered  # the failures have a key now
    assert sum(t == "expert" for t in after_gate.types.values()) == N  # joined people's questions, not replaced
    after = compare_runs(after_gate, *runs_of(after_gate), SETTINGS, pooled=after_gate.with_unanswered())
    assert after.better and after.by_type["expert"]["delta"] > 0
