"""Tables of the feedback store (SQLAlchemy Core: the same schema on SQLite and Postgres).

A query row holds what was asked and which passages were retrieved (`retrievals`, with ranks and scores);
`passages` keeps the passage text as last served and `passage_versions` every text ever served under a chunk id
(a document edited without moving its chunk boundaries keeps the ids), so each retrieval's `text_hash` names the
exact text that query was shown: exports and training use what the user rated, not the chunk set of the day.
Explicit feedback arrives in submissions (one per POST, deduplicated by idempotency key) that hold one
`feedback` row per rating; `feedback.event_id` is the high-water mark the retrain sensor counts from.
Experts label (question, passage) pairs of the annotation queue in `expert_labels`, append-only: the latest row of
an item is its label, a row without a grade retracts it (undo); `label_id` is the experts' own high-water mark.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

metadata = MetaData()

ANSWER_SOURCES = ("system", "user", "expert")
FEEDBACK_TARGETS = ("answer", "passage", "correction")
EVENT_KINDS = ("click", "reformulation")

queries = Table(
    "queries",
    metadata,
    Column("query_id", String(36), primary_key=True),
    Column("text", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
    Column("session_id", String(128), index=True),
    Column("model_version", String(256), comment="embedding model name and weights version that served it"),
    Column("settings", JSON),
    Column("latency_ms", Float),
    Column(
        "timings_ms",
        JSON,
        comment="the request's steps in ms (retrieve, rerank, generate; an interleaved canary "
        "answer: rank_production and rank_canary, each arm's own ranking timed back to back)",
    ),
    Column(
        "arm",
        String(16),
        comment="production or canary while a canary ran (rag.rollout); NULL outside a canary "
        "and for requests without a session id",
    ),
    Column(
        "client_session",
        String(64),
        index=True,
        comment="the session the server issued (rag.serving.sessions): a canary credits a query only with "
        "signals sent under it; session_id is the client's own label",
    ),
    Column(
        "client_key",
        String(32),
        comment="keyed hash of where the request came from: a canary bounds what one client adds to its "
        "evidence, however many sessions it opens (the address is not stored)",
    ),
)

passages = Table(
    "passages",
    metadata,
    Column("chunk_id", String(512), primary_key=True),
    Column("doc_id", String(1024), nullable=False),
    Column("page_start", Integer),
    Column("page_end", Integer),
    Column("text", Text, nullable=False),
)

passage_versions = Table(
    "passage_versions",
    metadata,
    Column("chunk_id", String(512), ForeignKey("passages.chunk_id"), primary_key=True),
    Column("text_hash", String(64), primary_key=True, comment="sha256 of the text"),
    Column("doc_id", String(1024), nullable=False),
    Column("page_start", Integer),
    Column("page_end", Integer),
    Column("text", Text, nullable=False),
    Column("first_served_at", DateTime(timezone=True)),
)

retrievals = Table(
    "retrievals",
    metadata,
    Column("query_id", String(36), ForeignKey("queries.query_id"), primary_key=True),
    Column("chunk_id", String(512), ForeignKey("passages.chunk_id"), primary_key=True),
    Column("rank", Integer, nullable=False),
    Column("score", Float),
    Column("cited", Boolean, nullable=False, default=False),
    Column("text_hash", String(64), comment="the passage version this query was shown (passage_versions)"),
    Column(
        "team",
        String(16),
        comment="canary queries: the arm whose ranking contributed the passage (team-draft "
        "interleaving), production or canary; NULL otherwise and for neighbours the pipeline added",
    ),
    Column(
        "shared",
        Boolean,
        comment="canary queries: both arms' rankings would have shown this passage at this pick, "
        "so its clicks and ratings credit neither arm; NULL outside canary queries",
    ),
)

answers = Table(
    "answers",
    metadata,
    Column("answer_id", String(36), primary_key=True),
    Column("query_id", String(36), ForeignKey("queries.query_id"), nullable=False, index=True),
    Column("text", Text, nullable=False),
    Column("source", String(16), nullable=False),
    Column("not_in_context", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint(f"source IN {ANSWER_SOURCES}", name="answer_source"),
)

submissions = Table(
    "feedback_submissions",
    metadata,
    Column("submission_id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(128), nullable=False, unique=True),
    Column("payload_hash", String(64), nullable=False),
    Column("query_id", String(36), ForeignKey("queries.query_id"), nullable=False, index=True),
    Column("session_id", String(128)),
    Column("client_session", String(64), comment="the server-issued session that sent it (NULL: none)"),
    Column("comment", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

feedback = Table(
    "feedback",
    metadata,
    Column("event_id", Integer, primary_key=True, autoincrement=True),
    Column("submission_id", Integer, ForeignKey("feedback_submissions.submission_id"), nullable=False, index=True),
    Column("query_id", String(36), ForeignKey("queries.query_id"), nullable=False, index=True),
    Column("target", String(16), nullable=False),
    Column("answer_id", String(36), ForeignKey("answers.answer_id")),
    Column("chunk_id", String(512), ForeignKey("passages.chunk_id")),
    Column("score", SmallInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("score IN (-1, 1)", name="feedback_score"),
    CheckConstraint(f"target IN {FEEDBACK_TARGETS}", name="feedback_target"),
)

implicit_events = Table(
    "implicit_events",
    metadata,
    Column("event_id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(128), unique=True),
    Column("query_id", String(36), ForeignKey("queries.query_id"), nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("chunk_id", String(512), ForeignKey("passages.chunk_id")),
    Column("related_query_id", String(36), ForeignKey("queries.query_id")),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column(
        "session_id",
        String(128),
        comment="the session label the client sent with the event",
    ),
    Column(
        "client_session",
        String(64),
        comment="the server-issued session that sent the event: a canary counts a click only from the session "
        "that was shown the query",
    ),
    CheckConstraint(f"kind IN {EVENT_KINDS}", name="event_kind"),
)

expert_labels = Table(
    "expert_labels",
    metadata,
    Column("label_id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(128), nullable=False, unique=True),
    Column("payload_hash", String(64), nullable=False),
    Column("item_id", String(64), nullable=False, index=True, comment="rag.annotation.queue.item_id(question, chunk)"),
    Column(
        "query_id",
        String(36),
        ForeignKey("queries.query_id"),
        comment="the production question labelled; NULL for a synthetic one",
    ),
    Column("question", Text, nullable=False),
    Column("chunk_id", String(512), ForeignKey("passages.chunk_id"), nullable=False),
    Column("text_hash", String(64), nullable=False, comment="the passage version the expert read (passage_versions)"),
    Column(
        "grade",
        SmallInteger,
        comment="2 relevant, 1 partially relevant, 0 irrelevant; NULL: an undo, the item has no label again",
    ),
    Column("expert_answer", Text, comment="the answer the expert expects to the question, when given"),
    Column("expert", String(128), nullable=False, comment="who labelled: the name the expert gave"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("grade IS NULL OR grade IN (0, 1, 2)", name="expert_grade"),
)
