"""The annotation queue: uncertainty signals, the selection methods (diversity, quotas, seeds, weights) on tiny
in-memory candidates, labels since the last refresh; people's questions first, keyword strings and page furniture
left out; and the asset end to end on a tiny corpus with wordllama, as the demo builds it last."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rag.annotation.build import build_queue
from rag.annotation.candidates import (
    Candidate,
    Question,
    furniture_keys,
    is_furniture,
    pick_questions,
    production_questions,
    reads_as_a_question,
    synthetic_questions,
)
from rag.annotation.config import AnnotationSettings
from rag.annotation.queue import AnnotationQueue, QueueItem, item_id
from rag.annotation.report import current_labels, since_refresh
from rag.annotation.select import Pool, select
from rag.annotation.signals import combine, margin_signals, pair_signals
from rag.retrieval import Hit


def _pool(per_doc_uncertainty: dict[str, list[float]], vectors: bool = True) -> Pool:
    """Candidates of three questions per document; document d0's are the most uncertain by far."""
    u, questions, documents, vecs = [], [], [], []
    rng = np.random.default_rng(7)
    for d, values in per_doc_uncertainty.items():
        centre = rng.normal(size=16)
        for j, value in enumerate(values):
            u.append(value)
            questions.append(f"{d}-q{j % 3}")
            documents.append(d)
            vecs.append(centre + 0.05 * rng.normal(size=16))  # one topic per document
    return Pool(np.array(u), questions, documents, np.array(vecs) if vectors else None)


SKEWED = {
    "d0": [0.99, 0.98, 0.97, 0.96, 0.95, 0.94],
    "d1": [0.5, 0.49, 0.48],
    "d2": [0.45, 0.44, 0.43],
    "d3": [0.40, 0.39, 0.38],
}


def test_uncertainty_takes_the_most_uncertain_and_active_spreads_over_documents_within_quotas():
    pool = _pool(SKEWED)
    uncertain = select(pool, 6, "uncertainty", AnnotationSettings())
    assert {pool.documents[i] for i in uncertain} == {"d0"}  # all from one document
    settings = AnnotationSettings(per_document=2, per_question=1)
    active = select(pool, 6, "active", settings)
    docs = [pool.documents[i] for i in active]
    assert len(active) == 6 and len(set(docs)) >= 3
    assert max(docs.count(d) for d in set(docs)) <= 2  # the per-document quota holds
    questions = [pool.questions[i] for i in active]
    assert len(questions) == len(set(questions))  # per_question=1
    assert active[0] == int(np.argmax(pool.uncertainty))  # the first pick is the most uncertain pair


def test_quotas_cap_the_queue_when_the_pool_runs_out():
    pool = _pool({"d0": [0.9, 0.8, 0.7], "d1": [0.6, 0.5, 0.4]})
    chosen = select(pool, 10, "active", AnnotationSettings(per_document=1, per_question=None))
    assert sorted(pool.documents[i] for i in chosen) == ["d0", "d1"]


@pytest.mark.parametrize("diversity", ["mmr", "k-center"])
def test_question_vectors_spread_the_picks_without_quotas(diversity):
    pool = _pool(SKEWED)  # d0's questions are near-paraphrases (one topic per document) and the most uncertain
    settings = AnnotationSettings(diversity=diversity, mmr_lambda=0.5, per_document=None, per_question=None)
    assert len({pool.documents[i] for i in select(pool, 4, "active", settings)}) >= 3
    # MMR weighing uncertainty more stays with d0's paraphrases longer.
    greedy = select(pool, 4, "active", settings.model_copy(update={"diversity": "mmr", "mmr_lambda": 0.95}))
    assert [pool.documents[i] for i in greedy].count("d0") >= 2


def test_without_vectors_the_question_quota_spreads_the_picks():
    pool = _pool(SKEWED, vectors=False)
    chosen = select(pool, 4, "active", AnnotationSettings(per_document=None, per_question=1))
    assert len({pool.questions[i] for i in chosen}) == 4
    # A question's own second pair is not "similar to itself": without a quota the most uncertain pairs come first.
    unlimited = AnnotationSettings(per_document=None, per_question=None)
    assert select(pool, 4, "active", unlimited) == select(pool, 4, "uncertainty", unlimited)


def test_seeded_methods_are_deterministic_and_random_differs_by_seed():
    pool = _pool({d: [0.5] * 6 for d in ("d0", "d1", "d2", "d3")})  # all tied: only the seed orders them
    for method in ("active", "uncertainty", "random"):
        a = select(pool, 5, method, AnnotationSettings(seed=1))
        assert a == select(pool, 5, method, AnnotationSettings(seed=1))
    runs = {tuple(select(pool, 5, "random", AnnotationSettings(seed=s))) for s in range(5)}
    assert len(runs) > 1
    seeded = AnnotationSettings(seed=1)
    assert select(pool, 5, "random", seeded) != select(pool, 5, "uncertainty", seeded)


def test_signals_and_weights_change_the_order():
    # Closeness to the top score (the top pair: its lead over the runner-up), against the spread of the list.
    assert margin_signals([0.9, 0.89, 0.5, 0.1]) == pytest.approx([1 - 0.01 / 0.8, 1 - 0.01 / 0.8, 1 - 0.4 / 0.8, 0.0])
    q = Question("why", "synthetic")
    chunk = lambda n: {"chunk_id": f"c{n}", "doc_id": "d", "text": "t"}  # noqa: E731
    candidates = [
        Candidate(q, chunk(1), 1, 0.95, {"bm25": 1, "dense": 1, "reranker": 1}, 0.95),  # sure, all lists agree
        Candidate(q, chunk(2), 2, 0.52, {"bm25": 2, "dense": 2, "reranker": 2}, 0.52),  # probability near 0.5
        Candidate(q, chunk(3), 3, 0.10, {"bm25": 1, "reranker": 3}, 0.10),  # BM25 first, dense missed it
    ]
    signals = pair_signals(candidates, depth=100)
    assert signals[1]["probability"] > 0.9 > signals[0]["probability"]
    assert signals[2]["disagreement"] > signals[1]["disagreement"] == 0.0
    by_probability = combine(signals, {"probability": 1.0})
    by_disagreement = combine(signals, {"disagreement": 1.0})
    assert int(np.argmax(by_probability)) == 1 and int(np.argmax(by_disagreement)) == 2
    # Without a reranker the probability signal is absent and drops out of the mean.
    plain = pair_signals(
        [Candidate(q, chunk(1), 1, 0.7, {"bm25": 3, "dense": 1}), Candidate(q, chunk(2), 2, 0.6, {"bm25": 1})]
    )
    assert all("probability" not in s for s in plain) and combine(plain, {"probability": 1.0, "margin": 1.0})


def _hits(question: str, docs: list[str]) -> list[Hit]:
    return [
        Hit(
            r,
            1.0 - 0.1 * r,
            {
                "chunk_id": f"{question[:6]}-{d}-{r}",
                "doc_id": d,
                "text": f"passage {r}",
                "page_start": 1,
                "page_end": 1,
            },
            {"bm25_rank": float(5 - r), "dense_rank": float(r)},
        )
        for r, d in enumerate(docs, start=1)
    ]


def test_build_queue_skips_labelled_pairs_and_keeps_stable_ids():
    questions = [Question(f"question {i}", "synthetic") for i in range(4)]
    rank = lambda q: _hits(q, ["a", "b", "c", "d"])  # noqa: E731
    settings = AnnotationSettings(size=5, k=4, per_document=None, per_question=None, method="uncertainty")
    first = build_queue(questions, rank, settings, strategy="paragraph", reranked=False)
    assert len(first.queue.items) == 5 and first.candidates == 16 and first.skipped_labelled == 0
    labelled = {first.queue.items[0].item_id}
    again = build_queue(questions, rank, settings, strategy="paragraph", reranked=False, labelled=labelled)
    assert again.skipped_labelled == 1 and labelled.isdisjoint(i.item_id for i in again.queue.items)
    item = again.queue.items[0]
    assert item.item_id == item_id(item.question, item.chunk_id) and item.source == "synthetic" and item.signals


def test_questions_come_from_production_first_then_synthetic():
    recent = pd.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "text": ["How old?", "how  OLD?", "Where is it?"],
            "created_at": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]),
        }
    )
    production = production_questions(recent, 10)
    assert [q.query_id for q in production] == ["q3", "q2"]  # newest first, a repeat counted once
    qa = pd.DataFrame(
        {
            "question": [
                "A copied sentence of the text.",
                "Who wrote it?",
                "where is it?",
                "pdfplumber test suite unstructured",
                "06aup1 4702",
            ],
            "qtype": ["inverse-cloze", "answer-aware", "keyword", "keyword", "llm"],
        }
    )
    synthetic = synthetic_questions(qa, 10, seed=3)
    assert synthetic[-1].text == "A copied sentence of the text."  # copies last
    assert {q.text for q in synthetic} == {"A copied sentence of the text.", "Who wrote it?", "where is it?"}
    mixed = pick_questions(production, synthetic, 4)
    assert [q.source for q in mixed] == ["production", "production", "synthetic", "synthetic"]
    assert "where is it?" not in [q.text for q in mixed]  # already asked by a user
    assert [q.source for q in pick_questions([], synthetic, 2)] == ["synthetic", "synthetic"]


def test_keyword_strings_do_not_read_as_questions():
    keywords = ["pdfplumber test suite unstructured", "06aup1 4702", "removing software wire routing installation"]
    asked = ["Who argued for the respondent in Knowles v. Mirzayance?", "How many handgun permit checks in Alabama?"]
    sentences = ["The keeper logs the wind speed every four hours."]  # a copied sentence is not a keyword string
    assert [reads_as_a_question(t) for t in keywords + asked + sentences] == [False] * 3 + [True] * 3


STAMP = "VerDate Sep<11>2014 18:06 Aug 06, 2020 Jkt 250001 PO 00000 Frm 00001 Fmt 4700"


def test_people_s_questions_fill_the_queue_first_and_furniture_passages_are_left_out():
    """The generated questions' pairs are the more uncertain ones, yet the pairs of the question a person asked come
    first; a passage that is mostly its document's recorded page furniture, or a page label, is no item, a passage
    that quotes one stamp among its body lines still is."""
    from rag.parsing.boilerplate import record
    from rag.parsing.models import ElementDraft

    asked = Question("where do the ships steer", "production", "q1")
    generated = [Question(f"What is generated question {i}?", "synthetic") for i in range(3)]
    body = "Ships steer by the beam of the lighthouse.\nThe lamp turns slowly all night long."
    texts = {"a": f"{STAMP}\n{STAMP[:-1]}1", "b": f"{body}\n{STAMP}", "c": body, "d": body, "e": "Page 1 of 205"}

    def rank(question: str) -> list[Hit]:
        # The person's question has a clear winner (sure: small margins signal); the generated ones three contenders.
        scores = [1.0, 0.2, 0.15, 0.1, 0.05] if question == asked.text else [0.9, 0.89, 0.88, 0.5, 0.45]
        return [
            Hit(r, score, {"chunk_id": f"{question}-{d}", "doc_id": d, "text": texts[d]})
            for r, (d, score) in enumerate(zip("abcde", scores), start=1)
        ]

    stamped = record([ElementDraft(type="footer", text=STAMP)])  # what the parse records in the metadata
    documents = pd.DataFrame(
        {
            "doc_id": ["a", "b", "c", "d"],
            "metadata_json": [json.dumps({"boilerplate": stamped} if d in "ab" else {}) for d in "abcd"],
        }
    )
    keys = furniture_keys(documents)
    assert set(keys) == {"a", "b"}
    settings = AnnotationSettings(size=6, k=5, per_document=None, per_question=None, method="uncertainty")
    built = build_queue(
        [asked, *generated],
        rank,
        settings,
        strategy="paragraph",
        reranked=False,
        furniture=lambda chunk: is_furniture(chunk, keys),
    )
    items = built.queue.items
    assert [i.source for i in items] == ["production"] * 3 + ["synthetic"] * 3
    # a (the recorded stamp) and e (a page label, which no parse records on a one-page document), for each question
    assert built.skipped_furniture == 8 and {"a", "e"}.isdisjoint(i.doc_id for i in items)
    assert "b" in {i.doc_id for i in items}  # a stamp among body lines: a passage still
    # Preferred, not more uncertain: uncertainty alone would have put the generated pairs first.
    assert max(i.uncertainty for i in items[:3]) < min(i.uncertainty for i in items[3:])


def test_labels_since_the_last_refresh_follow_undos_and_the_previous_queue():
    def item(n):
        return QueueItem(
            item_id=f"i{n}",
            question="q",
            source="synthetic",
            chunk_id=f"c{n}",
            doc_id="d",
            text="t",
            uncertainty=0.5,
        )

    previous = AnnotationQueue(
        created_at=pd.Timestamp("2024-05-01T00:00:00Z").to_pydatetime(),
        strategy="p",
        selection="active",
        items=[item(1), item(2)],
    )
    labels = pd.DataFrame(
        {
            "label_id": [1, 2, 3, 4, 5],
            "item_id": ["i0", "i1", "i2", "i2", "i9"],
            "grade": [2, 1, 0, None, 2],
            "expert": ["e"] * 5,
            "created_at": pd.to_datetime(["2024-04-01", "2024-05-02", "2024-05-02", "2024-05-03", "2024-05-04"]),
        }
    )
    assert set(current_labels(labels)["item_id"]) == {"i0", "i1", "i9"}  # i2 was undone
    progress = since_refresh(previous, labels)
    assert progress["labels_since_refresh"] == 2 and progress["labelled_from_previous_queue"] == 1
    assert since_refresh(None, labels)["labels_since_refresh"] == 0


def test_settings_refuse_unknown_signals_and_methods():
    with pytest.raises(ValueError, match="unknown uncertainty signals"):
        AnnotationSettings(weights={"confidence": 1.0})
    with pytest.raises(ValueError, match="unknown selection method"):
        AnnotationSettings(method="greedy")


def _metadata(result) -> dict:
    return {
        k: getattr(v, "value", v)
        for k, v in result.asset_materializations_for_node("annotation_queue")[0].metadata.items()
    }


TOPICS = {
    "lighthouses": "Lighthouses guide ships at night. Their lamps turn slowly.",
    "bakery": "The bakery opens at six. Sourdough needs a long rise.",
    "glaciers": "Glaciers carve valleys. Ice moves a few metres a year.",
    "trains": "Night trains cross the alps. Sleeper cars have bunks.",
}
ASKED = "When do lighthouses turn their lamps?"  # the one question a person asked
KEYWORDS = "lighthouses lamps turn slowly"  # a generated keyword string


def tiny_corpus(root: Path, *, furniture: bool = False) -> dict:
    """Four one-topic documents chunked (paragraph), BM25- and wordllama-indexed under root, a synthetic QA set of
    one question per topic and one question a person asked; the resources annotation_queue runs with. `furniture`:
    a fifth document whose passage is the page stamp its parse recorded (a chunk set built before the parse set
    furniture aside), and a keyword string among the generated questions."""
    from rag.chunking import get_chunker
    from rag.embedding import load_embedder
    from rag.evaluation.qaset import Evidence, QAItem, to_frame
    from rag.feedback import FeedbackStore
    from rag.ingest import document_to_row
    from rag.parsing.boilerplate import METADATA_KEY, record
    from rag.parsing.models import ElementDraft, assemble
    from rag.pipeline import bm25_step, chunk_step, embed_step
    from rag.store import DOCUMENTS_TABLE, TableStore
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.storage import DataStore

    tables = TableStore(root / "tables")
    texts = {name: [f"{text} More about {name} here."] * 3 for name, text in TOPICS.items()}
    stamp = [ElementDraft(type="footer", text=STAMP)]
    docs = [
        assemble(
            [ElementDraft(type="narrative", text=text) for text in paragraphs],
            doc_id=f"{name}.txt",
            source_path=name,
            content_hash=name,
            parser="test",
            n_pages=1,
            metadata={METADATA_KEY: record(stamp)} if name == "stamps" else None,
        )
        for name, paragraphs in {**texts, **({"stamps": [STAMP] * 3} if furniture else {})}.items()
    ]
    tables.write(pd.DataFrame([document_to_row(d, "test") for d in docs]), DOCUMENTS_TABLE)
    chunk_step(tables, get_chunker("paragraph"))
    qdrant = QdrantResource(path=str(root / "qdrant"))
    bm25_step(tables, root, "paragraph")
    embed_step(tables, qdrant.client(), "paragraph", "wordllama", load_embedder("wordllama"))
    questions = {f"What about {name} at night?": ("answer-aware", name) for name in TOPICS}
    if furniture:
        questions[KEYWORDS] = ("keyword", "lighthouses")
    qa = [
        QAItem(
            qid=f"s{i}",
            question=question,
            qtype=qtype,
            doc_id=f"{name}.txt",
            evidence=[Evidence(doc_id=f"{name}.txt", start=0, end=10)],
        )
        for i, (question, (qtype, name)) in enumerate(questions.items())
    ]
    tables.write(to_frame(qa), "synthetic_qa")
    store = FeedbackStore(root=root)
    store.record_query(ASKED, answer="-", chunks=[])
    store.close()
    return {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": qdrant,
        "feedback_loop": FeedbackLoop(data_dir=str(root)),
    }


def test_asset_writes_the_queue_with_coverage_and_progress(tmp_path):
    """Materialize annotation_queue on four tiny documents (wordllama, no reranker): production queries first,
    synthetic ones to top up, and the metadata counts the labels given since the previous queue."""
    from dagster import materialize

    from assets.annotation import annotation_queue
    from rag.annotation.queue import read_queue
    from rag.feedback import FeedbackStore
    from rag.index.qdrant import close_client

    root = tmp_path / "data"
    resources = tiny_corpus(root)
    qdrant = resources["qdrant"]
    config = {
        "ops": {
            "annotation_queue": {
                "config": {
                    "model": "wordllama",
                    "strategy": "paragraph",
                    "size": 6,
                    "k": 3,
                    "per_document": 2,
                    "per_question": 2,
                }
            }
        }
    }
    try:
        first = materialize([annotation_queue], resources=resources, run_config=config)
        assert first.success
        meta = _metadata(first)
        queue = read_queue(root)
        assert queue is not None and len(queue.items) == meta["queue_size"] == 6
        assert meta["production_questions_considered"] == 1 and meta["synthetic_questions_considered"] == 4
        assert meta["distinct_documents"] >= 3 and meta["corpus_documents"] == 4 and meta["labels_since_refresh"] == 0
        assert all(c <= 2 for c in pd.Series([i.doc_id for i in queue.items]).value_counts())
        assert "| uncertainty |" in meta["preview"] and meta["served"]["reranker"] == "none"
        assert queue.config["method"] == "active" and queue.selection == "active"

        # An expert labels one item through the store (what the expert view does): the next refresh counts it and
        # leaves the pair out.
        from rag.feedback.models import ExpertLabel

        item = queue.items[0]
        labelled = item.item_id
        store = FeedbackStore(root=root)
        store.record_expert_label(
            ExpertLabel(item_id=labelled, expert="tester", idempotency_key="k1", grade=2),
            question=item.question,
            query_id=item.query_id,
            passage={
                "chunk_id": item.chunk_id,
                "doc_id": item.doc_id,
                "page_start": 1,
                "page_end": 1,
                "text": item.text,
            },
        )
        store.close()
        # A gate left a pair nobody rated (rag.annotation.pool): it goes first, before active learning's picks.
        from rag.annotation.pool import GatePool, PoolItem, write_pool

        other = queue.items[1]
        pooled = PoolItem(
            question=ASKED, chunk_id=other.chunk_id, doc_id=other.doc_id, text=other.text, side="candidate", rank=2
        )
        write_pool(
            root, GatePool(kind="reranker", candidate="v2", against="v1", outcome="inconclusive", items=[pooled])
        )
        second = materialize([annotation_queue], resources=resources, run_config=config)
        meta2 = _metadata(second)
        assert meta2["previous_queue_size"] == 6 and meta2["labels_since_refresh"] == 1
        assert meta2["labelled_from_previous_queue"] == 1 and meta2["already_labelled_skipped"] == 1
        rebuilt = read_queue(root).items
        assert labelled not in {i.item_id for i in rebuilt}
        assert meta2["gate_pool_pairs"] == 1 and (rebuilt[0].source, rebuilt[0].question) == ("gate", ASKED)
        assert rebuilt[0].chunk_id == other.chunk_id and len({i.item_id for i in rebuilt}) == len(rebuilt)
    finally:
        close_client(qdrant.settings())


def demo_queue(root: Path) -> tuple[int, dict]:
    """The tiny corpus (with furniture and a keyword string) and the queue the demo's last step builds over it, on a
    test instance: (the step's failures, the queue's materialization metadata)."""
    from dagster import AssetKey, instance_for_test

    from orchestration.demo import build_annotation_queue
    from rag.index.qdrant import close_client

    resources = tiny_corpus(root, furniture=True)
    try:
        with instance_for_test() as instance:
            failures = build_annotation_queue(instance, {}, "wordllama", resources=resources)
            event = instance.get_latest_materialization_event(AssetKey("annotation_queue"))
    finally:
        close_client(resources["qdrant"].settings())
    metadata = event.asset_materialization.metadata if event is not None else {}
    return failures, {k: getattr(v, "value", v) for k, v in metadata.items()}


def test_the_demo_ends_with_a_queue_that_puts_people_s_questions_first(tmp_path, capsys):
    """The demo's last step on a corpus where production cannot be opened (wordllama alone is indexed): it falls
    back to the indexed model, and the queue holds the question a person asked first, no keyword string and no
    passage of page furniture."""
    from rag.annotation.queue import read_queue

    root = tmp_path / "data"
    failures, meta = demo_queue(root)
    said = capsys.readouterr().out
    assert failures == 0 and "building it with wordllama" in said
    queue = read_queue(root)
    assert queue is not None and queue.items and len(queue.items) == meta["queue_size"]
    sources = [item.source for item in queue.items]
    assert sources[0] == "production" and queue.items[0].question == ASKED
    assert sources == sorted(sources)  # "production" < "synthetic": every pair of a person's question comes first
    assert KEYWORDS not in {item.question for item in queue.items} and meta["keyword_questions_dropped"] == 1
    assert "stamps.txt" not in {item.doc_id for item in queue.items} and meta["furniture_passages_skipped"] >= 1
    assert f"annotation queue: {meta['queue_size']} items" in said
    assert f"{meta['from_production']} from people's questions" in said


def test_sensor_rebuilds_once_per_retrain_and_the_schedule_runs_daily():
    from dagster import AssetMaterialization, SensorResult, SkipReason, build_schedule_context, build_sensor_context
    from dagster import instance_for_test

    from sensors.annotation import annotation_after_retrain_sensor, annotation_queue_daily

    with instance_for_test() as instance:
        first = annotation_after_retrain_sensor(build_sensor_context(instance=instance))
        assert isinstance(first, SkipReason) and "no retrain yet" in first.skip_message
        instance.report_runless_asset_event(AssetMaterialization("trained_reranker"))
        fired = annotation_after_retrain_sensor(build_sensor_context(instance=instance))
        assert isinstance(fired, SensorResult) and fired.run_requests[0].run_key.startswith("annotation-after-retrain:")
        again = annotation_after_retrain_sensor(build_sensor_context(instance=instance, cursor=fired.cursor))
        assert isinstance(again, SkipReason) and f"#{fired.cursor}" in again.skip_message
        with build_schedule_context(instance=instance) as context:
            assert annotation_queue_daily(context).tags["trigger"] == "daily"
