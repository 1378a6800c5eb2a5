"""bench/loop.py on a tiny corpus, through the product's own path (rag serve's app, feedback_volume_sensor,
retrain_job, the gate, canary_sensor): a strong, consistent signal from people must end in a served improvement, and
people who click at random must never get anything promoted.

The corpus is built so that one configuration is plainly better for people: every company's report names the
company only in its opening paragraph, and each fact sits in a paragraph of its own that never names it. Served
paragraph by paragraph, "what was Kestrel's revenue" finds some company's revenue paragraph; served whole, the
report that names Kestrel. Only the configuration learner runs (the embedder's fine-tuning would take minutes)."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from types import SimpleNamespace


NAMES = [
    "Kestrel", "Bramble", "Quillon", "Harrowgate", "Mistral", "Corvid", "Ferrule", "Galloway", "Hollins", "Juniper",
    "Larkspur", "Marlowe", "Nettle", "Oakhurst", "Pimlico", "Rowan", "Saffron", "Tamsin", "Umber", "Verity",
]  # fmt: skip
CITIES = [
    "Aberdeen", "Bristol", "Cardiff", "Derby", "Exeter", "Falkirk", "Glasgow", "Hereford", "Inverness", "Jarrow",
    "Kendal", "Leeds", "Margate", "Norwich", "Oban", "Preston", "Ripon", "Salford", "Truro", "Ullapool",
]  # fmt: skip


def tiny_corpus(folder):
    """20 company reports; people ask three facts of each, the test scores the fourth."""
    rng = random.Random(5)
    docs, queries, answers, users, test = [], [], [], [], []
    for i, (name, city) in enumerate(zip(NAMES, CITIES)):
        facts = {
            "revenue": (f"{rng.randint(100, 999)},{rng.randint(100, 999)} thousand pounds", "What was the revenue of"),
            "staff": (f"{rng.randint(1000, 9999)} employees", "How many employees did"),
            "city": (f"the city of {city}", "Where is the head office of"),
            "founded": (f"the year {rng.randint(1850, 1990)}", "When was"),
        }
        paragraphs = [
            f"{name} Group plc presents its annual report for the financial year. {name} Group is a diversified "
            "holding company with interests in logistics, retail and property across the country.",
            f"Over the year the revenue of the group reached {facts['revenue'][0]}, after a strong second half "
            "and the integration of the businesses acquired in the previous period.",
            f"At the end of the period the group employed {facts['staff'][0]} across all of its divisions, up "
            "from the year before, with most of them in the logistics business.",
            f"The registered head office of the group is located in {facts['city'][0]}, where the board meets "
            "every quarter and where the finance function is based.",
            f"The business was first established in {facts['founded'][0]} as a small family partnership, and it "
            "was listed on the stock exchange decades later.",
        ]
        docs.append({"_id": f"report-{i}", "title": "", "text": "\n\n".join(paragraphs)})
        for j, (fact, (answer, asked)) in enumerate(facts.items()):
            suffix = {"revenue": " Group this year?", "staff": " Group have?", "city": " Group?"}
            question = f"{asked} {name}" + suffix.get(fact, " Group founded?")
            qid = f"q{i}-{fact}"
            queries.append({"_id": qid, "text": question})
            answers.append({"query_id": qid, "answers": [answer]})
            (test if j == 3 else users).append(f"{qid}\treport-{i}\t1")
    (folder / "qrels").mkdir(parents=True)
    for name, rows in (("corpus", docs), ("queries", queries), ("answers", answers)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for split, rows in (("users", users), ("test", test)):
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return folder


def run_loop(tmp_path, monkeypatch, behaviour: str, ceiling: bool = False, **changed) -> dict:
    from bench import loop

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "unused"))  # restored after: the bench points it at its own
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = argparse.Namespace(
        corpus="beir",
        data=tiny_corpus(tmp_path / "corpus"),
        strategies=["paragraph", "whole-document"],
        learners=["configuration"],
        rounds=2,
        round_size=30,
        tick_every=10,
        feedback_threshold=20,
        canary_share=0.5,
        users_questions=None,
        test_questions=None,
        documents=None,
        articles=None,
        users_share=0.5,
        passages_per_document=0,
        max_steps=None,
        max_pairs=None,
        behaviour=behaviour,
        eta=0.5,
        p_relevant=1.0,
        p_negative=0.3,
        p_click_noise=0.0,
        p_answer_rating=0.8,
        p_correction=0.8,
        seed=3,
        ceiling=ceiling,
        harm_drill=False,
    )
    vars(args).update(changed)
    record: dict = {"args": vars(args)}
    loop.one_corpus(args, record, lambda: None)
    return record


def promotions(corpus: dict) -> list[dict]:
    runs = [op for entry in corpus["rounds"] for op in entry["operations"] if "job" in op]
    return [
        released
        for run in runs
        for name, released in run["released"].items()
        if name.startswith("production_") and released.get("action") == "promoted"
    ] + [run for run in runs if run["job"] == "promote_canary_job" and run["success"]]


def test_a_strong_consistent_signal_ends_in_a_served_improvement(tmp_path, monkeypatch):
    record = run_loop(tmp_path, monkeypatch, "consistent", ceiling=True)
    corpus = record["corpus"]
    before = corpus["round_0"]["scores"]["recall@5"]
    last = corpus["rounds"][-1]
    assert promotions(corpus), json.dumps(corpus["rounds"], indent=1, default=str)[:4000]
    assert last["production"]["configuration"] is not None
    assert last["served"]["strategy"] == "whole-document"
    assert last["scores"]["recall@5"] > before + 0.3
    assert last["paired_vs_untrained_default"]["recall@5"]["p_value"] < 0.05
    # What people get: the passages the answer reads hold the answer more often, and no more often than the best
    # configuration scored on the test labels themselves (the oracle ceiling).
    assert last["scores"]["answer_read"] > corpus["round_0"]["scores"]["answer_read"]
    best = corpus["ceiling"]["configurations"][0]
    assert len(corpus["ceiling"]["configurations"]) == 2 * 8  # two chunk sets x the grid
    assert best["answer_read"] >= last["scores"]["answer_read"] - 0.05, best
    # The ablation summary reads the same run back: what served at the end, its paired gain and the ceiling.
    from bench.loop_ablation import row_of

    row = row_of("loop-tiny", record)
    assert row["production"]["configuration"] == last["production"]["configuration"]
    assert row["paired"]["recall@5"]["delta"] > 0.3 and row["paired"]["recall@5"]["p_value"] < 0.05
    assert row["ceiling"]["best_configuration_answer_read"] == best["answer_read"]
    assert row["releases"], "the promotion that served the configuration is listed"
    assert row_of("loop-tiny-quick", {**record, "args": {**record["args"], "quick": True}}) is None


def test_a_harm_drill_gates_its_model_and_canaries_it_over_the_verdict_and_never_promotes_it(tmp_path, monkeypatch):
    """An operator's drill: a reranker trained on labels shuffled across questions is gated (not better), canaried
    over the verdict with the drill's reason recorded, and judged by the people it serves; the result says how its
    canary stood or ended. No retrain runs beside it (the threshold is out of reach), so nothing else ends it."""
    record = run_loop(
        tmp_path, monkeypatch, "consistent", harm_drill=True, passages_per_document=2, feedback_threshold=10**6
    )
    corpus = record["corpus"]
    drill = corpus["harm_drill"]
    assert drill["gate"]["outcome"] != "better" and drill["canary_started"], drill
    started = [op for op in corpus["rounds"][0]["operations"] if op.get("sensor") == "canary_sensor"]
    assert started and started[0]["skip"].startswith(f"canary {drill['candidate']}: "), started
    assert drill.get("outcome") in (None, "rolled_back"), drill  # a drill's canary is never promoted
    assert not [op for entry in corpus["rounds"] for op in entry["operations"] if op.get("job") == "promote_canary_job"]
    assert corpus["rounds"][-1]["production"]["reranker"] is None
    assert not [op for entry in corpus["rounds"] for op in entry["operations"] if op.get("job") == "retrain_job"]


def test_people_who_click_at_random_get_nothing_promoted(tmp_path, monkeypatch):
    corpus = run_loop(tmp_path, monkeypatch, "random")["corpus"]
    assert not promotions(corpus)
    assert all(entry["production"]["configuration"] is None for entry in corpus["rounds"])


def test_the_run_by_document_counts_each_document_once_where_its_first_passage_comes():
    from types import SimpleNamespace

    from bench.lib.loop import served_lists
    from bench.lib.loop_data import Question
    from rag.retrieval import Hit

    docs = ["a.md", "a.md", "b.md", "c.md", "b.md"]
    hits = [
        Hit(
            rank=r,
            score=1.0 - r / 10,
            chunk={"chunk_id": f"{d}#{r}", "doc_id": d, "text": "x", "char_start": 0, "char_end": 1},
        )
        for r, d in enumerate(docs)
    ]
    answerer = SimpleNamespace(rank=lambda text: hits, settings=SimpleNamespace(max_context_chars=10_000))
    run, by_document, _ = served_lists(answerer, [Question("q", "question?", ["b.md"])])
    assert list(run["q"]) == [f"{d}#{r}" for r, d in enumerate(docs)]
    assert sorted(by_document["q"], key=by_document["q"].get, reverse=True) == ["a.md", "b.md", "c.md"]


def test_the_expert_grades_people_questions_by_their_relevance_and_skips_generated_ones(tmp_path):
    """bench.lib.loop.Expert through the real annotation routes (a fake answerer, no model): 2 where the passage is
    relevant to the people's question, else 0; items of a question no person asked skipped without counting against
    the round's labels; at most the labels asked for; no queue yet is no label and no error."""
    from fastapi.testclient import TestClient

    from bench.lib.loop import EXPERT_TOKEN, TOKEN, Expert
    from bench.lib.loop_data import Question
    from rag.annotation.queue import AnnotationQueue, QueueItem, item_id, write_queue
    from rag.feedback import FeedbackStore
    from rag.serving.app import create_app
    from rag.serving.settings import ServeSettings
    from tests.test_api import FakeAnswerer

    people = [Question("q1", "What was the revenue of Kestrel Group?", []), Question("q2", "Where is Oban?", [])]
    relevant = {"q1": {"a1"}, "q2": {"b1"}}

    def queued(question: str, chunk_id: str, source: str) -> QueueItem:
        return QueueItem(
            item_id=item_id(question, chunk_id),
            question=question,
            source=source,
            chunk_id=chunk_id,
            doc_id="d",
            text=f"passage {chunk_id}",
            uncertainty=0.5,
        )

    items = [
        queued("a generated question?", "a1", "synthetic"),  # skipped, though its passage answers q1
        queued("What was the revenue of Kestrel Group?", "a1", "gate"),  # 2
        queued("another generated one", "b1", "synthetic"),  # skipped
        queued("what was  the REVENUE of kestrel group?", "a2", "production"),  # q1 as normalized text: 0
        queued("Where is Oban?", "b1", "production"),  # 2
        queued("Where is Oban?", "b2", "production"),  # 0, left for the next call
    ]
    root = tmp_path / "data"
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    settings = ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN)
    app = create_app(lambda: FakeAnswerer(), store, settings, root=root)
    with TestClient(app) as http:
        expert = Expert(http, people, lambda q: relevant[q.qid], page=3)  # a small page: the skipped come back first
        none = expert.label(5)
        assert none["no_queue"] and none["labelled"] == none["skipped"] == 0 and not store.current_expert_labels()

        write_queue(root, AnnotationQueue(strategy="paragraph", selection="active", items=items))
        first = expert.label(3)
        assert first["labelled"] == 3 and first["relevant"] == 2 and first["skipped"] == 2
        assert first["queue_size"] == 6 and not first["no_queue"]
        assert first["by_source"] == {"gate": 1, "production": 2}
        grades = {k: v["grade"] for k, v in store.current_expert_labels().items()}
        assert grades == {items[1].item_id: 2, items[3].item_id: 0, items[4].item_id: 2}

        rest = expert.label(10)  # only one gradable item is left: one label, the generated ones still skipped
        assert rest["labelled"] == 1 and rest["relevant"] == 0 and rest["skipped"] == 2
        grades = {k: v["grade"] for k, v in store.current_expert_labels().items()}
        assert grades[items[5].item_id] == 0 and len(grades) == 4
        assert expert.label(10)["labelled"] == 0  # nothing gradable left
    store.close()


def test_the_result_file_names_the_expert_labels():
    from bench.loop import result_name

    args = argparse.Namespace(
        corpus="tatqa",
        behaviour="consistent",
        canary_behaviour=None,
        learners=["embedder", "reranker", "configuration"],
        quick=False,
        expert_labels=0,
    )
    assert result_name(args) == "loop-tatqa.json"
    args.expert_labels, args.quick = 20, True
    assert result_name(args) == "loop-tatqa-experts20-quick.json"
    args.behaviour, args.learners, args.quick = "random", ["reranker"], False
    assert result_name(args) == "loop-tatqa-random-reranker-experts20.json"
    args.behaviour, args.expert_labels, args.promotion_test = "consistent", 0, "one-sided"
    assert result_name(args) == "loop-tatqa-reranker-one-sided-promotion.json"
    args.promotion_test, args.harm_drill = None, True
    assert result_name(args) == "loop-tatqa-reranker-harm-drill.json"


class _FakeServer:
    """/ask shows passages p0..p9 (p0 holds the answer); every /feedback body is kept."""

    def __init__(self):
        self.cookies, self.feedback = SimpleNamespace(clear=lambda: None), []

    def post(self, path, json, headers):
        if path == "/feedback":
            self.feedback.append(json)
        body = {
            "query_id": "q",
            "session": "s",
            "model_version": "base",
            "passages": [{"chunk_id": f"p{i}"} for i in range(10)],
        }
        return SimpleNamespace(json=lambda: body, raise_for_status=lambda: None)


def test_people_who_click_at_random_vote_at_random_and_consistent_people_by_what_they_were_shown():
    from bench.lib.loop import ClickModel, People
    from bench.lib.loop_data import Question

    def votes(behaviour: str, relevant: set[str]) -> set[int]:
        server = _FakeServer()
        people = People(server, ClickModel(behaviour=behaviour, p_answer_rating=1.0), lambda q: relevant, seed=3)
        for i in range(40):
            people.ask(Question(f"q{i}", "what is it?", []), person=f"person-{i}")
        return {body["answer_score"] for body in server.feedback if "answer_score" in body}

    assert votes("consistent", {"p0"}) == {1} and votes("consistent", {"elsewhere"}) == {-1}
    assert votes("random", {"p0"}) == {1, -1}  # before, a random clicker's own click made every vote an up-vote


def test_inverted_judgements_like_the_passages_without_the_answer_and_vote_on_the_answer_honestly():
    from bench.lib.loop import ClickModel, People
    from bench.lib.loop_data import Question

    server = _FakeServer()
    model = ClickModel(behaviour="inverted", eta=0.0, p_answer_rating=1.0, p_negative=1.0, p_correction=0.0)
    people = People(server, model, lambda q: {"p0"}, seed=3)
    for i in range(20):
        people.ask(Question(f"q{i}", "what is it?", []), person=f"person-{i}")
    ratings = [r for body in server.feedback for r in body.get("passages", [])]
    liked = {r["chunk_id"] for r in ratings if r["score"] > 0}
    rejected = {r["chunk_id"] for r in ratings if r["score"] < 0}
    assert rejected == {"p0"} and "p0" not in liked and len(liked) == 9
    assert {body["answer_score"] for body in server.feedback} == {1}  # the answer was shown: voted up, honestly


def test_the_credit_rules_weigh_a_rating_above_a_bare_click(tmp_path):
    """bench/canary_credit.py's rules on a minimal feedback store: a candidate's passage clicked and rated +1 beside a
    bare click on production's is a tie on clicks and +1s, a win where ratings outweigh bare clicks; a bare click
    alone is a loss, except on the +1s alone."""
    import sqlite3

    from bench.lib.loop import canary_credit_split

    store = tmp_path / "feedback.sqlite"
    with sqlite3.connect(store) as db:
        db.executescript(
            "create table queries (query_id text, model_version text, arm text);"
            "create table retrievals (query_id text, chunk_id text, team text, shared int, rank int);"
            "create table implicit_events (query_id text, chunk_id text, kind text);"
            "create table feedback (query_id text, chunk_id text, score int, target text, event_id int);"
        )
        for query in ("rated", "bare"):
            db.execute("insert into queries values (?, 'pair', 'canary')", (query,))
            for rank, (chunk, team) in enumerate((("p1", "production"), ("c1", "canary")), start=1):
                db.execute("insert into retrievals values (?, ?, ?, 0, ?)", (query, chunk, team, rank))
            db.execute("insert into implicit_events values (?, 'p1', 'click')", (query,))
        db.execute("insert into implicit_events values ('rated', 'c1', 'click')")
        db.execute("insert into feedback values ('rated', 'c1', 1, 'passage', 1)")
    split = canary_credit_split(store)["pair"]
    counts = {rule: (c["wins"], c["losses"], c["ties"]) for rule, c in split.items()}
    assert counts["positive"] == (0, 1, 1)  # rated: 1 to 1, a tie; bare: production's click wins
    assert counts["confirmed"] == counts["ratings first"] == (1, 1, 0)
    assert counts["ratings"] == (1, 0, 1)


def test_the_ablation_counts_harm_drills_apart_from_the_loop_runs(tmp_path):
    """A drill is an operator's rehearsal: no row of the runs, a row of the targets saying how many drills rolled the
    harmful model's canary back within 200 people's questions."""
    from bench.loop_ablation import drill_target, drills, row_of

    def drill_record(outcome: str, after: int) -> dict:
        drill = {"candidate": "ce-ltr-v1", "version": "v1", "gate": {"outcome": "worse"}, "canary_started": True}
        drill |= {"outcome": outcome, "after_questions": after, "canary_queries": after // 2}
        paired = {"recall@5": {"delta": -0.2, "ci_low": -0.25, "ci_high": -0.15, "p_value": 1e-9, "n": 9}}
        return {
            "args": {"harm_drill": True, "canary_share": 0.5, "tick_every": 10},
            "corpus": {
                "corpus": "tatqa",
                "headline": "recall@5",
                "round_0": {"scores": {"recall@5": 0.5}},
                "rounds": [{"asked_total": after, "scores": {"recall@5": 0.5}}],
                "harm_drill": drill,
                "rerankers_on_test": [{"name": "ce-ltr-v1", "paired_vs_untrained_default": paired}],
            },
        }

    for name, outcome, after in (("a", "rolled_back", 60), ("b", "rolled_back", 240), ("c", "canary", 200)):
        (tmp_path / f"loop-tatqa-drill-{name}.json").write_text(json.dumps(drill_record(outcome, after)))
    assert row_of("loop-tatqa-drill-a", drill_record("rolled_back", 60)) is None
    found = drills(tmp_path)
    assert [d["rolled_back_within"] for d in found] == [True, False, False]
    assert found[0]["on_test"]["delta"] == -0.2
    (row,) = drill_target(found)
    assert row["reached"] == ["loop-tatqa-drill-a"] and row["runs"] == 3
    from tests.test_docs import load_renderer

    cells = load_renderer()._ablation_target(row)
    assert cells[2] == "1 of 3" and "rolled back after 60 people's questions (30 served by its canary" in cells[4]
    assert "recall@5 -0.2000" in cells[5] and "its gate worse" in cells[5]
