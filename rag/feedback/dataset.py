"""Export the feedback store as a RAG-Dataset: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv)
plus answers, ±1 qrels for chunks, documents and answers, the raw feedback rows and stats.json.

    corpus.jsonl            {_id: passage id, title: doc_id, text, metadata: {chunk_id, text_hash, doc_id,
                            page_start, page_end}} (the text each query was shown: a passage id is the chunk id, or
                            chunk_id@<hash> for a text served under that id before the chunk was edited)
    queries.jsonl           {_id: query_id, text, metadata: {created_at, session_id, model_version, retrieved,
                            reformulation_of}} (reformulation_of: the first query of the chain of rephrasings this
                            one ends, by the store's reformulation events, whether or not that one was rated; null
                            when it rephrased nothing)
    answers.jsonl           {_id: answer_id, query_id, text, source: system|user|expert, not_in_context}
    qrels/chunk_qrels.tsv   query-id, corpus-id, score (+1 / -1; the latest rating of a passage wins)
    qrels/document_qrels.tsv  query-id, doc-id, score (+1 if any passage of the document was rated up, else -1)
    qrels/answer_qrels.tsv  query-id, answer-id, score (+1 / -1; a correction counts +1 for its answer)
    qrels/train.tsv         the positive chunk qrels only, so BEIR tools (and rag.evaluation.beir) read the folder
    qrels/expert_qrels.tsv  query-id, corpus-id, score (2 relevant / 1 partially relevant / 0 irrelevant: each
                            annotation item's current expert label; an undone label is left out)
    feedback.jsonl          every rating with its submission's comment and session
    expert_labels.jsonl     every expert label row, undos included (grade null), with who and when, and the
                            dataset_query_id its qrel has
    stats.json              counts, the store's high-water marks (feedback and expert labels) and a content
                            fingerprint (the version)

Expert-labelled questions are in queries.jsonl with metadata.expert_answer (the latest answer an expert gave with
a current label; null when none): a production question under its query_id, a synthetic one of the annotation
queue under `expert:<hash of the question>` with metadata.source "expert-queue". The passages they graded are in
corpus.jsonl, as the expert read them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from rag.feedback.store import FeedbackStore, text_hash


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def _write_qrels(path: Path, rows: list[tuple[str, str, int]], id_column: str = "corpus-id") -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["query-id", id_column, "score"])
        writer.writerows(rows)


def _latest(ratings: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    return ratings.sort_values("event_id").drop_duplicates(key, keep="last")


EXPERT_QUERY_PREFIX = "expert:"


def expert_query_id(question: str) -> str:
    """The dataset id of a synthetic (queue) question: the same text, however spaced or cased, is one question."""
    normalized = " ".join(question.lower().split())
    return EXPERT_QUERY_PREFIX + hashlib.sha256(normalized.encode()).hexdigest()[:16]


def _live_expert_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """The label rows no undo retracted (an undo retracts every earlier label of its item), by label_id."""
    labels = labels.sort_values("label_id")
    undone = labels[labels["grade"].isna()].groupby("item_id")["label_id"].max()
    after = labels["label_id"] > labels["item_id"].map(undone).fillna(0)
    return labels[after & labels["grade"].notna()]


def export_rag_dataset(store: FeedbackStore, out_dir: Path) -> Path:
    """Write the dataset of every query that received explicit feedback into out_dir; returns out_dir."""
    out_dir = Path(out_dir)
    (out_dir / "qrels").mkdir(parents=True, exist_ok=True)
    high_water_mark = store.high_water_mark()  # read first: rows after it may or may not be in this export
    expert_mark = store.expert_high_water_mark()
    fb = store.table("feedback")
    fb = fb[fb["event_id"] <= high_water_mark]
    subs = store.table("feedback_submissions")[["submission_id", "comment", "session_id", "idempotency_key"]]
    expert_rows = store.table("expert_labels")
    expert_rows = expert_rows[expert_rows["label_id"] <= expert_mark].sort_values("label_id")
    expert_rows = expert_rows.assign(
        dataset_query_id=[
            qid if isinstance(qid, str) else expert_query_id(text)
            for qid, text in zip(expert_rows["query_id"], expert_rows["question"])
        ]
    )
    live = _live_expert_labels(expert_rows)
    current = live.drop_duplicates("item_id", keep="last")  # each item's label: its latest live row
    queries = store.table("queries")
    queries = queries[queries["query_id"].isin(set(fb["query_id"]) | set(current["query_id"].dropna()))]
    queries = queries.sort_values("created_at")
    retrievals = store.table("retrievals")
    retrievals = retrievals[retrievals["query_id"].isin(set(queries["query_id"]))].sort_values(["query_id", "rank"])
    latest = store.table("passages").set_index("chunk_id")
    versions = store.table("passage_versions").set_index(["chunk_id", "text_hash"])
    answers = store.table("answers")
    answers = answers[answers["query_id"].isin(set(queries["query_id"]))]

    # Each (query, chunk) is exported with the version of the text that query was shown; the latest text keeps the
    # plain chunk id, so ids still match today's chunk set when nothing was edited.
    latest_hash = {cid: text_hash(text) for cid, text in latest["text"].items()}
    passages: dict[str, dict] = {}

    def passage(chunk_id: str, digest) -> str:
        """The corpus id of this version of the chunk's text, added to the corpus on first use."""
        digest = digest if isinstance(digest, str) else latest_hash[chunk_id]
        pid = chunk_id if digest == latest_hash[chunk_id] else f"{chunk_id}@{digest[:12]}"
        if pid not in passages:
            version = versions.loc[(chunk_id, digest)] if (chunk_id, digest) in versions.index else latest.loc[chunk_id]
            passages[pid] = {
                "chunk_id": chunk_id,
                "text_hash": digest,
                "doc_id": version["doc_id"],
                "text": version["text"],
                "page_start": _int(version["page_start"]),
                "page_end": _int(version["page_end"]),
            }
        return pid

    shown = {(r.query_id, r.chunk_id): passage(r.chunk_id, r.text_hash) for r in retrievals.itertuples()}

    chunk_ratings = _latest(fb[fb["target"] == "passage"], ["query_id", "chunk_id"])
    chunk_qrels = sorted(
        (r.query_id, shown[(r.query_id, r.chunk_id)], int(r.score)) for r in chunk_ratings.itertuples()
    )
    doc_of = {pid: p["doc_id"] for pid, p in passages.items()}
    doc_scores: dict[tuple[str, str], int] = {}
    for qid, cid, score in chunk_qrels:
        key = (qid, doc_of[cid])
        doc_scores[key] = max(doc_scores.get(key, -1), score)
    answer_ratings = _latest(fb[fb["target"].isin(["answer", "correction"])], ["query_id", "answer_id"])
    answer_qrels = sorted((r.query_id, r.answer_id, int(r.score)) for r in answer_ratings.itertuples() if r.answer_id)

    expert_qrels = sorted(
        {(r.dataset_query_id, passage(r.chunk_id, r.text_hash)): int(r.grade) for r in current.itertuples()}.items()
    )
    expert_qrels = [(qid, pid, grade) for (qid, pid), grade in expert_qrels]
    used_chunks = sorted(passages)
    _write_jsonl(
        out_dir / "corpus.jsonl",
        [
            {
                "_id": pid,
                "title": p["doc_id"],
                "text": p["text"],
                "metadata": {k: p[k] for k in ("chunk_id", "text_hash", "doc_id", "page_start", "page_end")},
            }
            for pid, p in sorted(passages.items())
        ],
    )
    retrieved = {
        qid: [{"chunk_id": shown[(qid, r.chunk_id)], "rank": int(r.rank), "score": r.score} for r in group.itertuples()]
        for qid, group in retrievals.groupby("query_id")
    }
    origin = _reformulation_origins(store.table("implicit_events"))
    expert_answers = {
        qid: text
        for qid, text in zip(live["dataset_query_id"], live["expert_answer"])
        if isinstance(text, str) and text
    }  # live is in label order: the latest answer stays
    expert_said = {qid: {"expert_answer": expert_answers.get(qid)} for qid in set(current["dataset_query_id"])}
    synthetic = current[current["query_id"].isna()].drop_duplicates("dataset_query_id")
    _write_jsonl(
        out_dir / "queries.jsonl",
        [
            {
                "_id": q.query_id,
                "text": q.text,
                "metadata": {
                    "created_at": q.created_at,
                    "session_id": q.session_id,
                    "model_version": q.model_version,
                    "retrieved": retrieved.get(q.query_id, []),
                    "reformulation_of": origin.get(q.query_id),
                    **expert_said.get(q.query_id, {}),
                },
            }
            for q in queries.itertuples()
        ]
        + [
            {
                "_id": q.dataset_query_id,
                "text": q.question,
                "metadata": {
                    "created_at": q.created_at,
                    "session_id": None,
                    "model_version": None,
                    "retrieved": [],
                    "reformulation_of": None,
                    "source": "expert-queue",
                    **expert_said[q.dataset_query_id],
                },
            }
            for q in synthetic.itertuples()
        ],
    )
    _write_jsonl(
        out_dir / "answers.jsonl",
        [
            {
                "_id": a.answer_id,
                "query_id": a.query_id,
                "text": a.text,
                "source": a.source,
                "not_in_context": bool(a.not_in_context),
            }
            for a in answers.itertuples()
        ],
    )
    _write_qrels(out_dir / "qrels" / "chunk_qrels.tsv", chunk_qrels)
    _write_qrels(
        out_dir / "qrels" / "document_qrels.tsv", sorted((q, d, s) for (q, d), s in doc_scores.items()), "doc-id"
    )
    _write_qrels(out_dir / "qrels" / "answer_qrels.tsv", answer_qrels, "answer-id")
    _write_qrels(out_dir / "qrels" / "train.tsv", [row for row in chunk_qrels if row[2] > 0])
    _write_qrels(out_dir / "qrels" / "expert_qrels.tsv", expert_qrels)
    rows = fb.merge(subs, on="submission_id", how="left").sort_values("event_id")
    _write_jsonl(
        out_dir / "feedback.jsonl",
        [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in rows.to_dict("records")],
    )
    _write_jsonl(
        out_dir / "expert_labels.jsonl",
        [
            {k: (None if pd.isna(v) else int(v) if k == "grade" else v) for k, v in row.items() if k != "payload_hash"}
            for row in expert_rows.to_dict("records")
        ],
    )

    digest = hashlib.sha256()
    fingerprinted = [
        "corpus.jsonl",
        "queries.jsonl",
        "answers.jsonl",
        "qrels/chunk_qrels.tsv",
        "qrels/answer_qrels.tsv",
    ]
    # Only when there are expert labels: a store without them keeps the version its exports had before they existed.
    for name in fingerprinted + (["qrels/expert_qrels.tsv"] if expert_qrels else []):
        digest.update((out_dir / name).read_bytes())
    grades = [grade for *_, grade in expert_qrels]
    stats = {
        "version": digest.hexdigest()[:16],
        "high_water_mark": high_water_mark,
        "expert_high_water_mark": expert_mark,
        "queries": len(queries) + len(synthetic),
        "passages": len(used_chunks),
        "answers": len(answers),
        "answers_by_source": {k: int(v) for k, v in answers["source"].value_counts().items()},
        "feedback_events": len(fb),
        "chunk_qrels_positive": sum(1 for *_, sc in chunk_qrels if sc > 0),
        "chunk_qrels_negative": sum(1 for *_, sc in chunk_qrels if sc < 0),
        "answer_qrels_positive": sum(1 for *_, sc in answer_qrels if sc > 0),
        "answer_qrels_negative": sum(1 for *_, sc in answer_qrels if sc < 0),
        "document_qrels": len(doc_scores),
        "expert_labels": len(expert_rows),
        "expert_questions": len({qid for qid, *_ in expert_qrels}),
        "expert_qrels": len(expert_qrels),
        "expert_grades": {str(g): grades.count(g) for g in (2, 1, 0)},
        "expert_answers": len(set(expert_answers) & {qid for qid, *_ in expert_qrels}),
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return out_dir


def _reformulation_origins(events: pd.DataFrame) -> dict[str, str]:
    """query id -> the first query of the chain of rephrasings it ends. Followed through every query in the store,
    not only the rated ones: a question rated, rephrased without a rating, rephrased again and rated is one
    question, and only the chain says so (the first and last may be too far apart for the session window)."""
    links = events[events["kind"] == "reformulation"]
    previous = dict(zip(links["related_query_id"], links["query_id"]))  # the rephrasing -> what it rephrased
    origins: dict[str, str] = {}
    for query in previous:
        seen, first = {query}, previous[query]
        while (
            first in previous and previous[first] not in seen
        ):  # a cycle cannot come from the store; never loop on one
            seen.add(first)
            first = previous[first]
        origins[query] = first
    return origins


def _int(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _read_qrels(path: Path) -> list[tuple[str, str, int]]:
    return _read_qrels_as(path, "corpus-id")


def _read_qrels_as(path: Path, id_column: str) -> list[tuple[str, str, int]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return [(r["query-id"], r[id_column], int(r["score"])) for r in csv.DictReader(fh, delimiter="\t")]


@dataclass(frozen=True)
class QueryContext:
    """When and where a query was asked: what ties a rephrasing to the question it rephrases."""

    session_id: str | None
    created_at: datetime | None
    reformulation_of: str | None  # the first query of the chain of rephrasings this one ends (possibly unrated)


@dataclass(frozen=True)
class Judgments:
    """The passage-level ratings of a RAG-Dataset: query texts, passage texts, and (query, chunk, ±1) rows;
    `asked`: each query's session, time and reformulation link (empty for a dataset exported without them), so
    that rag.training.data.split_feedback keeps a question's paraphrases on one side. `expert_qrels`: (query,
    passage, grade 0/1/2) of the experts' current labels, `expert_answers`: query -> the answer an expert expects
    (both empty for a dataset exported before expert labels)."""

    queries: dict[str, str]
    corpus: dict[str, str]
    chunk_qrels: list[tuple[str, str, int]]
    asked: dict[str, QueryContext] = field(default_factory=dict)
    expert_qrels: list[tuple[str, str, int]] = field(default_factory=list)
    expert_answers: dict[str, str] = field(default_factory=dict)
    # query -> the answers people wrote in (corrections, source user or expert): an answer key found in the
    # documents, also where none of the passages shown held it
    corrections: dict[str, list[str]] = field(default_factory=dict)
    answer_votes: dict[str, int] = field(default_factory=dict)  # query -> the latest ±1 on the system's answer


def _timestamp(value) -> datetime | None:
    if not value:
        return None
    stamp = datetime.fromisoformat(str(value))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)  # the store writes UTC (SQLite drops the zone)


def judgments(dataset_dir: Path) -> Judgments:
    dataset_dir = Path(dataset_dir)
    with open(dataset_dir / "queries.jsonl", encoding="utf-8") as fh:
        rows = list(map(json.loads, fh))
    queries = {q["_id"]: q["text"] for q in rows}
    meta = {q["_id"]: q.get("metadata") or {} for q in rows}
    asked = {
        qid: QueryContext(
            m.get("session_id") if isinstance(m.get("session_id"), str) else None,
            _timestamp(m.get("created_at")),
            m.get("reformulation_of"),
        )
        for qid, m in meta.items()
    }
    with open(dataset_dir / "corpus.jsonl", encoding="utf-8") as fh:
        corpus = {d["_id"]: d["text"] for d in map(json.loads, fh)}
    expert_file = dataset_dir / "qrels" / "expert_qrels.tsv"
    corrections: dict[str, list[str]] = {}
    system_answers: set[str] = set()
    if (dataset_dir / "answers.jsonl").exists():
        with open(dataset_dir / "answers.jsonl", encoding="utf-8") as fh:
            for answer in map(json.loads, fh):
                if answer.get("source") in ("user", "expert") and answer.get("query_id") in queries:
                    corrections.setdefault(answer["query_id"], []).append(answer["text"])
                elif answer.get("source") == "system":
                    system_answers.add(answer["_id"])
    answer_file = dataset_dir / "qrels" / "answer_qrels.tsv"
    votes = {
        qid: score
        for qid, answer_id, score in (_read_qrels_as(answer_file, "answer-id") if answer_file.exists() else [])
        if answer_id in system_answers
    }
    return Judgments(
        queries,
        corpus,
        _read_qrels(dataset_dir / "qrels" / "chunk_qrels.tsv"),
        asked,
        expert_qrels=_read_qrels(expert_file) if expert_file.exists() else [],
        expert_answers={qid: m["expert_answer"] for qid, m in meta.items() if m.get("expert_answer")},
        corrections=corrections,
        answer_votes=votes,
    )


def training_pairs(dataset_dir: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(positives, hard negatives) as (query text, passage text): passages rated +1, and retrieved passages
    rated -1, for the training assets."""
    j = judgments(dataset_dir)
    positives, negatives = [], []
    for qid, cid, score in j.chunk_qrels:
        (positives if score > 0 else negatives).append((j.queries[qid], j.corpus[cid]))
    return positives, negatives


def dataset_root(root: Path) -> Path:
    return Path(root) / "feedback_dataset"


def version_name(high_water_mark: int, expert_mark: int = 0) -> str:
    """hw-<feedback mark>, and -e<expert label mark> once there are expert labels (a store without them keeps the
    names its exports always had)."""
    return f"hw-{high_water_mark:010d}" + (f"-e{expert_mark:010d}" if expert_mark else "")


_VERSION_NAME = re.compile(r"hw-(\d+)(?:-e(\d+))?")


def export_versioned(store: FeedbackStore, root: Path) -> Path:
    """The dataset of everything up to the store's current high-water marks (feedback and expert labels), at
    <root>/feedback_dataset/hw-<mark>[-e<expert mark>]: written once (temp folder, then rename), reused afterwards."""
    import shutil
    import tempfile

    out = dataset_root(root) / version_name(store.high_water_mark(), store.expert_high_water_mark())
    if (out / "stats.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        export_rag_dataset(store, tmp)
        stats = json.loads((tmp / "stats.json").read_text())
        # Rows may have arrived since the name was picked: the name is the marks the export read.
        out = out.parent / version_name(stats["high_water_mark"], stats["expert_high_water_mark"])
        if (out / "stats.json").exists():
            return out
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def latest_dataset(root: Path) -> Path | None:
    """The newest exported version: both marks only grow, so the largest (feedback, expert) pair is the newest."""
    done = [
        (tuple(int(g or 0) for g in m.groups()), p)
        for p in dataset_root(root).glob("hw-*")
        if (m := _VERSION_NAME.fullmatch(p.name)) and (p / "stats.json").exists()
    ]
    return max(done)[1] if done else None
