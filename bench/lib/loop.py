"""The pieces of bench/loop.py: simulated people asking through `rag serve`, the product's sensors evaluated through
Dagster launching the product's jobs, and the served pipeline scored on held-out human questions.

Nothing here trains, gates or promotes by itself: the bench asks, clicks, rates and corrects through the API; then it
evaluates feedback_volume_sensor, drift_sensor and canary_sensor as the Dagster daemon would and runs whatever job
they request (retrain_job, start_canary_job, promote_canary_job, rollback_canary_job) in the same instance. With an
expert (`Expert`), annotation_after_retrain_sensor too (annotation_queue_job), and the expert grades queue items
through the expert view's routes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.lib.loop_data import Question, answer_evidence, holds_answer, relevance

TOKEN = "loop-bench-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# The expert view's token (ServeSettings.expert_token): /annotation/* refuses the users' token.
EXPERT_TOKEN = "loop-bench-expert-token-0123456789"
EXPERT_HEADERS = {"Authorization": f"Bearer {EXPERT_TOKEN}"}
# Every simulated person is its own client, as people behind an authenticating proxy are: the bench's server reads
# this header (ServeSettings.client_header), since all its requests come from one address, which a canary bounds as
# one client.
USER_HEADER = "X-Simulated-User"
BEHAVIOURS = ("consistent", "random", "shuffled", "inverted")


@dataclass
class ClickModel:
    """How simulated people react to what they are shown.

    A passage at rank r is examined with probability r^-eta (position bias). An examined passage that holds the answer
    is clicked and rated +1 with probability p_relevant; an examined one that does not is rated -1 with probability
    p_negative, or clicked (noise) with probability p_click_noise. The answer is rated (+1 when a shown passage holds
    the answer, else -1) with probability p_answer_rating, and a share p_correction of the questions whose shown
    passages hold no answer get a corrected answer (the question's answer string, where the corpus has one).

    behaviour "random": people who click and rate shown passages at random (relevance ignored); "shuffled": people
    whose judgements are consistent but about another question's answer (labels shuffled across questions). Neither
    carries any signal about what helps: whatever they train must never be promoted. "inverted": passage judgements
    recorded with their meaning flipped (a broken or poisoned collection: the shown passages without the answer are
    opened and liked, the ones with it rated down), while answer votes stay honest: meant to train a harmful model
    that held-out judgements of the same kind call better (on TAT-QA the warm start kept what it trained within 0.13
    points of recall@5 of the untrained default). `canary_behaviour` is how the
    answers a canary interleaves are judged (None: as the others): "consistent" models feedback that was corrupted
    (a poisoned or broken collection) while the people the canary serves react to what they see, so a harmful
    candidate meets real judgement."""

    eta: float = 1.0
    p_relevant: float = 0.9
    p_negative: float = 0.2
    p_click_noise: float = 0.05
    p_answer_rating: float = 0.5
    p_correction: float = 0.2
    behaviour: str = "consistent"
    canary_behaviour: str | None = None

    def __post_init__(self):
        for value in (self.behaviour, self.canary_behaviour or self.behaviour):
            if value not in BEHAVIOURS:
                raise ValueError(f"behaviour must be one of {BEHAVIOURS}, got {value!r}")


@dataclass
class People:
    """Simulated people, each question asked by its own person (client and session) through the API."""

    http: object  # a TestClient (or httpx client) on the app `rag serve` builds
    clicks: ClickModel
    relevant: Callable[[Question], set[str]]  # chunk ids of the served chunk set that hold the question's answer
    seed: int
    stats: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    _decoys: list[Question] = field(default_factory=list)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def ask(self, question: Question, person: str) -> dict:
        headers = {**HEADERS, USER_HEADER: person}
        self.http.cookies.clear()  # a new person: no session cookie of the one before (the server issues its own)
        response = self.http.post("/ask", json={"question": question.text, "session_id": person}, headers=headers)
        response.raise_for_status()
        data = response.json()
        self.stats["asked"] += 1
        interleaved = str(data.get("model_version") or "").startswith("interleaved(")
        self.stats["canary_served"] += interleaved
        behaviour = (self.clicks.canary_behaviour or self.clicks.behaviour) if interleaved else self.clicks.behaviour
        judged = question
        if behaviour == "shuffled":  # judged as if it asked something else
            self._decoys.append(question)
            judged = self.rng.choice(self._decoys)
        relevant = self.relevant(judged)
        shown = [p["chunk_id"] for p in data["passages"]]
        if behaviour == "random":
            relevant = set(self.rng.sample(shown, k=min(len(shown), 1)))
        hits = [c for c in shown if c in relevant]
        if behaviour == "inverted":
            relevant = set(shown) - relevant
        self.stats["asked_with_answer_shown"] += bool(hits)
        ratings = []
        for rank, chunk in enumerate(shown, start=1):
            if self.rng.random() >= rank**-self.clicks.eta:
                continue
            if chunk in relevant:
                if self.rng.random() < self.clicks.p_relevant:
                    self._post("/events", {"query_id": data["query_id"], "chunk_id": chunk}, data, headers)
                    self.stats["clicks"] += 1
                    ratings.append({"chunk_id": chunk, "score": 1})
            elif self.rng.random() < self.clicks.p_negative:
                ratings.append({"chunk_id": chunk, "score": -1})
            elif self.rng.random() < self.clicks.p_click_noise:
                self._post("/events", {"query_id": data["query_id"], "chunk_id": chunk}, data, headers)
                self.stats["clicks"] += 1
        body: dict = {"passages": ratings} if ratings else {}
        if self.rng.random() < self.clicks.p_answer_rating:
            # People who click at random vote at random too: scored as "a hit is whatever they clicked", every vote
            # of theirs was an up-vote, and any canary judged by others fell that far below on the guardrail.
            sure = 1 if hits else -1
            body["answer_score"] = self.rng.choice((1, -1)) if behaviour == "random" else sure
        if not hits and judged.answers and self.rng.random() < self.clicks.p_correction:
            body["correction"] = judged.answers[0][:4000]
        if body:
            self._post(
                "/feedback", {"query_id": data["query_id"], "idempotency_key": f"fb-{person}", **body}, data, headers
            )
            self.stats["ratings_up"] += sum(r["score"] > 0 for r in ratings)
            self.stats["ratings_down"] += sum(r["score"] < 0 for r in ratings)
            self.stats["answer_votes"] += "answer_score" in body
            self.stats["corrections"] += "correction" in body
        return data

    def _post(self, path: str, body: dict, answer: dict, headers: dict) -> None:
        response = self.http.post(path, json={**body, "session": answer["session"]}, headers=headers)
        response.raise_for_status()


@dataclass
class Expert:
    """A simulated expert working through the annotation queue over the API, as the expert view does: takes the
    queue's unlabelled items in order (GET /annotation/next) and grades each (POST /annotation/labels): 2 when the
    passage holds the answer of the question as the people's own judgement has it (`relevant`), else 0.

    The expert knows the answers of the users-split questions only (`questions`): an item whose question is none of
    them (a generated question topping up the queue) cannot be graded from the corpus labels and is skipped, which
    does not count against the round's labels."""

    http: object  # a TestClient (or httpx client) on the app `rag serve` builds, with served_app's expert token
    questions: list[Question]  # the questions whose relevance is known (the users split)
    relevant: Callable[[Question], set[str]]  # chunk ids that hold the question's answer (what People judge by)
    name: str = "loop-bench-expert"
    page: int = 100  # the most items asked for at once (GET /annotation/next's most)

    def __post_init__(self):
        from rag.annotation.candidates import normalized  # the queue's own sense of "the same question"

        self._normalized = normalized
        self.by_text: dict[str, list[Question]] = {}
        for question in self.questions:
            self.by_text.setdefault(self._normalized(question.text), []).append(question)

    def grade(self, item: dict) -> int | None:
        """2 relevant, 0 not; None when the item's question is none of the known questions."""
        known = self.by_text.get(self._normalized(item.get("question", "")))
        if not known:
            return None
        return 2 if any(item["chunk_id"] in self.relevant(q) for q in known) else 0

    def label(self, limit: int) -> dict:
        """Grade up to `limit` items of the current queue. Returns what was done: labelled, graded relevant,
        skipped (not a known question), the queue's size, labels per item source, and whether there was no queue
        (GET /annotation/next answered 409 or 503: nothing is labelled)."""
        done = {"labelled": 0, "relevant": 0, "skipped": 0, "queue_size": 0, "no_queue": False, "by_source": {}}
        skipped: set[str] = set()
        while done["labelled"] < limit:
            # Skipped items stay unlabelled, so they come first again: ask for them and what is still to label.
            wanted = min(self.page, limit - done["labelled"] + len(skipped))
            response = self.http.get(
                "/annotation/next", params={"expert": self.name, "limit": wanted}, headers=EXPERT_HEADERS
            )
            if response.status_code in (409, 503):  # no queue yet (no retrain), or one that cannot be read
                done["no_queue"] = True
                break
            response.raise_for_status()
            batch = response.json()
            done["queue_size"] = batch["progress"]["total"]
            fresh = [item for item in batch["items"] if item["item_id"] not in skipped]
            if not fresh:  # every unlabelled item the page shows was skipped already (more than `page` of them)
                break
            for item in fresh:
                if done["labelled"] >= limit:
                    break
                grade = self.grade(item)
                if grade is None:
                    skipped.add(item["item_id"])
                    continue
                body = {
                    "item_id": item["item_id"],
                    "expert": self.name,
                    "grade": grade,
                    "idempotency_key": f"{self.name}-{item['item_id']}-{grade}",
                }
                self.http.post("/annotation/labels", json=body, headers=EXPERT_HEADERS).raise_for_status()
                done["labelled"] += 1
                done["relevant"] += grade == 2
                source = item.get("source") or "?"
                done["by_source"][source] = done["by_source"].get(source, 0) + 1
            if len(batch["items"]) < wanted:  # the page held every unlabelled item: nothing further to take
                break
        done["skipped"] = len(skipped)
        return done


COUNTS = (
    "asked",
    "asked_with_answer_shown",
    "canary_served",
    "clicks",
    "ratings_up",
    "ratings_down",
    "answer_votes",
    "corrections",
)


@dataclass
class Operations:
    """The Dagster side: one instance, the product's definitions and resources; sensors evaluated as the daemon
    would, the jobs they request run in this process. Every sensor evaluation and job run is kept in `log`."""

    instance: object
    resources: dict
    refresh: Callable[[], None]  # what the server does when the registry or rollout state moved
    say: Callable[[str], None] = print
    log: list = field(default_factory=list)
    cursors: dict = field(default_factory=dict)

    def tick(self, sensor_name: str) -> list[dict]:
        """Evaluate a sensor once; run each job it requests. Returns the runs it caused."""
        from dagster import RunRequest, SensorResult, SkipReason, build_sensor_context

        from orchestration.definitions import defs

        sensor = defs.get_sensor_def(sensor_name)
        wanted = set(sensor.required_resource_keys)
        with build_sensor_context(
            instance=self.instance,
            resources={k: v for k, v in self.resources.items() if k in wanted},
            cursor=self.cursors.get(sensor_name),
        ) as context:
            result = sensor(context)
            cursor = context.cursor
        if isinstance(result, SensorResult):
            requests, skip, cursor = list(result.run_requests or []), result.skip_reason, result.cursor or cursor
        elif isinstance(result, RunRequest):
            requests, skip = [result], None
        elif isinstance(result, SkipReason):
            requests, skip = [], result
        else:
            requests, skip = list(result or []), None
        self.cursors[sensor_name] = cursor
        said = getattr(skip, "skip_message", None)
        entry = {"sensor": sensor_name, "skip": said, "requests": [r.job_name or sensor.job_name for r in requests]}
        self.log.append(entry)
        runs = []
        for request in requests:
            runs.append(self.run(request.job_name or sensor.job_name, request, sensor_name))
        return runs

    def run(self, job_name: str, request, why: str) -> dict:
        from orchestration.definitions import defs

        started = time.perf_counter()
        self.say(f"  {why} -> {job_name}")
        job = defs.resolve_job_def(job_name)
        if request.asset_selection:  # the learners the FeedbackLoop resource names (the job's name stays)
            job = job.get_subset(asset_selection=set(request.asset_selection))
        run_config = dict(request.run_config or {})
        run_config.setdefault("loggers", {"console": {"config": {"log_level": "WARNING"}}})
        result = job.execute_in_process(
            instance=self.instance,
            resources={k: v for k, v in self.resources.items()},
            run_config=run_config,
            tags=request.tags,
            raise_on_error=False,
        )
        self.refresh()
        record = {
            "job": job_name,
            "requested_by": why,
            "run_key": request.run_key,
            "success": result.success,
            "seconds": round(time.perf_counter() - started, 1),
            "checks": {
                e.check_name: {
                    "passed": e.passed,
                    **{
                        k: getattr(v, "value", v)
                        for k, v in e.metadata.items()
                        if isinstance(getattr(v, "value", v), (int, float, str, bool, dict)) and k != "comparison"
                    },
                }
                for e in result.get_asset_check_evaluations()
            },
            "released": {
                e.asset_key.to_user_string(): {
                    k: getattr(v, "value", v)
                    for k, v in e.materialization.metadata.items()
                    if k in ("action", "summary", "stage", "decision", "reason")
                }
                for e in result.get_asset_materialization_events()
                if e.asset_key.to_user_string().startswith(("production_", "model_rollout"))
            },
        }
        self.log.append(record)
        self.say(f"    {'ok' if result.success else 'FAILED'} in {record['seconds']} s: {record['released']}")
        return record


METRICS = ["recall@5", "ndcg@10", "mrr@10", "recall@20"]
# The same, with each document counted once where its first served passage comes: SciFact judges abstracts (BEIR's
# nDCG@10), so chunk-level figures count every paragraph of a relevant abstract and cannot be set beside BEIR's.
DOCUMENT_METRICS = {"doc_ndcg@10": "ndcg@10", "doc_recall@5": "recall@5"}
ANSWER_READ = "answer_read"  # share of questions whose passages the answer reads (top_k, context budget) hold it
HEADLINE = {"tatqa": "recall@5", "scifact": "doc_ndcg@10", "conditionalqa": "recall@5", "squad": "recall@5"}


class Judge:
    """The test split's relevance per chunk set (computed once per strategy the server serves), and the scoring of
    the served answerer against round 0."""

    def __init__(self, tables, questions):
        from rag.store import DOCUMENTS_TABLE

        self.tables, self.questions = tables, questions
        self.documents = tables.read(DOCUMENTS_TABLE)
        self.evidence = answer_evidence(questions, self.documents)
        self._qrels: dict[str, dict] = {}
        self.baseline = None

    def qrels(self, strategy: str) -> dict:
        from rag.store import CHUNKS_TABLE

        if strategy not in self._qrels:
            chunks = self.tables.read(CHUNKS_TABLE, strategy)
            self._qrels[strategy] = relevance(self.questions, self.documents, chunks, self.evidence)
        return self._qrels[strategy]

    def reads_answer(self, qid: str, read: list[tuple[str, int, int]]) -> bool:
        """Whether the text the answer reads ((doc_id, start, end) per passage, a passage cut to the context budget
        ending at the cut) holds an answer span: a long passage holding the answer past the cut does not."""
        return any(holds_answer(self.evidence.get(qid, []), *span) for span in read)

    def score(self, answerer) -> dict:
        from rag.evaluation.metrics import paired_comparison

        strategy = answerer.settings.strategy
        qrels = self.qrels(strategy)
        run, by_document, read = served_lists(answerer, self.questions)
        means, table = scored(qrels, run, self.questions, METRICS)
        documents = {q.qid: {d: 1 for d in q.doc_ids} for q in self.questions}
        doc_means, doc_table = scored(documents, by_document, self.questions, list(DOCUMENT_METRICS.values()))
        for name, metric in DOCUMENT_METRICS.items():
            table[name] = doc_table[metric].reindex(table.index)
            means[name] = doc_means[metric]
        # recall@5 counts a share of the relevant chunks, so it cannot compare chunk sets (every paragraph of a
        # document counts where no answer string is found, one whole document stands for them all); whether the
        # passages the answer reads hold the answer can.
        table[ANSWER_READ] = [float(self.reads_answer(q, read[q])) for q in table.index]
        means[ANSWER_READ] = round(float(table[ANSWER_READ].mean()), 4)
        out = {"served": answerer.served(), "scores": means}
        if self.baseline is None:
            self.baseline = table
        else:
            out["paired_vs_untrained_default"] = {
                m: paired_comparison(table[m], self.baseline[m]) for m in [*METRICS, *DOCUMENT_METRICS, ANSWER_READ]
            }
        return out


def served_lists(answerer, questions: list[Question], depth: int = 10) -> tuple[dict, dict, dict[str, list]]:
    """(ranx run of the served ranking, the same run by document, the text the answer reads per question as
    (doc_id, start, end) spans). The run by document lists the documents of the served passages in the order their
    first passage comes (what BEIR scores on SciFact, where a claim's relevant unit is an abstract); the text read is
    the ranking cut to the server's top_k and context budget as the answer stage cuts it
    (rag.qa.prompt.fit_context: a passage alone over the budget is read up to the cut)."""
    from rag.evaluation.qaset import visible_span
    from rag.qa.prompt import fit_context

    run, by_document, read = {}, {}, {}
    for q in questions:
        hits = answerer.rank(q.text)
        ranked = hits[:depth]
        run[q.qid] = {h.chunk["chunk_id"]: float(len(ranked) - r) for r, h in enumerate(ranked)} or {"-": 0.0}
        documents = list(dict.fromkeys(h.chunk["doc_id"] for h in ranked))
        by_document[q.qid] = {d: float(len(documents) - r) for r, d in enumerate(documents)} or {"-": 0.0}
        kept = fit_context(hits, answerer.settings.max_context_chars)
        read[q.qid] = [(h.chunk["doc_id"], *visible_span(h.chunk)) for h in kept]
    return run, by_document, read


def scored(qrels: dict[str, dict[str, int]], run: dict, questions: list[Question], metrics: list[str]):
    """(mean per metric, per-question table): questions without a relevant chunk stay in as misses."""
    from rag.evaluation.metrics import evaluate_run

    judged = {q.qid: qrels.get(q.qid, {}) for q in questions}
    mean, table = evaluate_run(judged, run, metrics)
    return {m: round(float(v), 4) for m, v in mean.items()}, table.set_index("qid")


def rerankers_on_test(app, judge, registry) -> list[dict]:
    """Every reranker the loop registered, served as its canary arm is (production's answerer with it in place) and
    scored on the test split: what each would have served, whatever its gate and canary said. An oracle view that
    decides nothing; it tells a learner that made no gain from a gate or canary that missed one."""
    from rag.serving.server import RerankerArm

    rows = []
    for mv in registry.versions("reranker"):
        arm = RerankerArm(app.state.serving.current, mv.name, data_dir_of(app))
        scored = judge.score(arm.current())
        gate, canary = mv.metrics.get("gate") or {}, mv.metrics.get("canary") or {}
        rows.append(
            {
                "name": mv.name,
                "gate": {k: gate.get(k) for k in ("outcome", "questions", "passed", "better")},
                "canary": canary.get("decision"),
                "scores": scored["scores"],
                "paired_vs_untrained_default": scored.get("paired_vs_untrained_default"),
            }
        )
    return rows


def embedders_on_test(app, judge, registry) -> list[dict]:
    """Every embedder the loop registered whose collection was built (a canary builds one), served as its canary arm
    is (production's settings with it as the model, from a replica of its collection) and scored on the test split.
    The oracle view rerankers_on_test gives; an embedder that never reached a canary has no collection to serve from
    and is listed without scores."""
    from rag.serving.server import serving_index

    rows = []
    answer = app.state.serving.settings()
    for mv in registry.versions("embedder"):
        gate, canary = mv.metrics.get("gate") or {}, mv.metrics.get("canary") or {}
        row = {
            "name": mv.name,
            "gate": {k: gate.get(k) for k in ("outcome", "questions", "passed", "better")},
            "canary": canary.get("decision"),
        }
        try:
            index = serving_index(answer.model_copy(update={"model": mv.name}), root=data_dir_of(app))
            answerer = index.current()
        except FileNotFoundError as exc:  # no collection of its own (never canaried): nothing to serve from
            rows.append({**row, "scores": None, "not_scored": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        try:
            scored = judge.score(answerer)
        finally:
            index.close()
        paired = scored.get("paired_vs_untrained_default")
        rows.append({**row, "scores": scored["scores"], "paired_vs_untrained_default": paired})
    return rows


def served_app(root: Path, store):
    """`rag serve`'s app as the loop runs it: the server's default settings (the chunk set and retrieval settings
    until a configuration is promoted), 10 passages shown, the bench's token, expert token and client header."""
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings

    settings = ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN, refresh_seconds=0, client_header=USER_HEADER)
    return build_app(settings, root=root, store=store, top_k=10, attribution=False)


def served_versions(registry) -> dict:
    from rag.registry import KINDS

    return {kind: (mv.name if (mv := registry.resolve(kind, "production")) else None) for kind in KINDS}


def data_dir_of(app) -> Path:
    return Path(app.state.serving.root)


def configuration_ceiling(tables, root: Path, judge, questions: list[Question], strategies: list[str], budget) -> list:
    """The grid of serving configurations (rag.training.configuration.ConfigurationSpace) scored on the test split's
    own labels: what a configuration learner could reach at best (an oracle, not a result). Rankings as the
    configuration search makes them (dense and BM25 fused, production embedder), cut to what the answer reads."""
    from rag.index.qdrant import QdrantSettings
    from rag.retrieval.service import open_index
    from rag.store import CHUNKS_TABLE
    from rag.training.configuration import ConfigurationSpace, _components, _fused, chunk_starts, passage_lengths

    space, rows = ConfigurationSpace(), []
    texts = {q.qid: q.text for q in questions}
    for strategy in strategies:
        chunks = tables.read(CHUNKS_TABLE, strategy)
        if chunks is None:
            continue
        lengths, starts, qrels = passage_lengths(chunks), chunk_starts(chunks), judge.qrels(strategy)
        length = lengths.get
        index = open_index(strategy, "production", root=root, qdrant=QdrantSettings(path=str(root / "qdrant")))
        known = set(chunks["chunk_id"])  # the chunk set the index serves
        components = _components(index, texts, space.candidates)
        for config in space.grid([strategy]):
            read_hits, recall = [], []
            for q, (dense, sparse) in components.items():
                ranked = [c for c, _ in _fused(config.mode, config.alpha, dense, sparse) if c in known]
                relevant = qrels.get(q, {})
                read = budget.chars_read(budget.cut(ranked, lambda c: length(c, 0)), lambda c: length(c, 0))
                spans = [(doc, start, min(end, start + read[c])) for c in read for doc, start, end in [starts[c]]]
                read_hits.append(judge.reads_answer(q, spans))
                recall.append(len(set(ranked[:5]) & set(relevant)) / len(relevant) if relevant else 0.0)
            rows.append(
                {
                    "configuration": config.label,
                    "answer_read": round(sum(read_hits) / len(read_hits), 4),
                    "recall@5": round(sum(recall) / len(recall), 4),
                }
            )
    return sorted(rows, key=lambda r: -r["answer_read"])


def canary_credit_split(store_path: Path) -> dict:
    """What the interleaved canary queries of a finished loop run's feedback store (SQLite) count under each credit
    rule: `positive` (clicks and +1s, what the canary decided on until 2026-11-30), `signed` (a -1 debiting its
    team, the rule before that), `negative` (the -1s alone), `plain` (shared picks credited, positive signals),
    `confirmed` (clicks and +1s, but where the person rated a passage +1, their clicks on passages they did not rate
    are left out: what it decides on now), `ratings` (the +1s alone) and `ratings first` (+1s, bare clicks breaking
    their ties). Each as candidate wins, losses, ties, with the sequential test's log-likelihood ratios, per
    interleaved model pair."""
    import sqlite3
    from collections import Counter, defaultdict

    from rag.rollout.interleaving import QueryCredit, credit
    from rag.rollout.sequential import log_harm_ratio, log_likelihood_ratio

    teams = {"production": "a", "canary": "b"}
    rules = ("positive", "signed", "negative", "plain", "confirmed", "ratings", "ratings first")
    counts: dict[str, dict[str, Counter]] = defaultdict(lambda: {rule: Counter() for rule in rules})
    with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True) as db:
        for query, pair in db.execute("select query_id, model_version from queries where arm = 'canary'").fetchall():
            shown = [
                (chunk, teams[team], bool(shared))
                for chunk, team, shared in db.execute(
                    "select chunk_id, team, shared from retrievals where query_id = ? and team is not null "
                    "order by rank",
                    (query,),
                )
            ]
            clicks = db.execute("select chunk_id from implicit_events where query_id = ? and kind = 'click'", (query,))
            ratings = db.execute(
                "select chunk_id, score from feedback where query_id = ? and target = 'passage' order by event_id",
                (query,),
            )
            said: dict = {chunk: "click" for (chunk,) in clicks}
            said |= {chunk: int(score) for chunk, score in ratings}
            negative = {chunk: 1 for chunk, signal in said.items() if signal == -1}  # each -1 as a point for its team
            # the rules before bare clicks beside a like were left out count them, as they did
            liked, disliked = credit(shown, said, clicks_beside_a_like=True), credit(shown, negative)
            rated = credit(shown, {c: v for c, v in said.items() if v != "click"})  # the +1s alone
            signed = QueryCredit(liked.a - disliked.a, liked.b - disliked.b)  # the rule before: a -1 debits its team
            outcome = {
                "positive": liked.outcome,
                "signed": signed.outcome,
                # a -1 is a point against its team: the team with more of them loses
                "negative": {"a": "b", "b": "a", "tie": "tie"}[disliked.outcome],
                "plain": credit([(d, t) for d, t, _ in shown], said, clicks_beside_a_like=True).outcome,
                "confirmed": credit(shown, said).outcome,
                "ratings": rated.outcome,
                # +1s decide; where they tie, the bare clicks do
                "ratings first": rated.outcome
                if rated.outcome != "tie"
                else credit(shown, {c: v for c, v in said.items() if v == "click"}).outcome,
            }
            for rule in rules:
                counts[pair][rule][outcome[rule]] += 1
    out = {}
    for pair, by_rule in counts.items():
        out[pair] = {}
        for rule, c in by_rule.items():
            wins, losses = c["b"], c["a"]
            out[pair][rule] = {
                "wins": wins,
                "losses": losses,
                "ties": c["tie"],
                "log_likelihood_ratio": round(float(log_likelihood_ratio(wins, losses)), 2),
                "log_harm_ratio": round(float(log_harm_ratio(wins, losses)), 2),
            }
    return out
